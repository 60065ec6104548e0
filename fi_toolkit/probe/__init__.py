"""The probe room: Forward Influence of evictions at a compression point (docs/method.md,
"Forward Influence" and "Noise floor").

From ``fi probe`` down to the KL divergence::

    fi probe
      -> fi_toolkit.cli.app.probe                          options -> ProbeSettings, load model and documents
      -> fi_toolkit.studies.probe_run.run_probe            each rank's documents, results written
      -> fi_toolkit.probe.experiment.probe_document        trace the prefix, resolve --select, tidy table
      -> fi_toolkit.probe.forward_influence.forward_influence
                                                           full-cache Reference, one masked forward per batch
      -> fi_toolkit.probe.kl.kl_from_reference             KL(P_full || P_e) over the full vocabulary

The modules, one job each:

- :mod:`~fi_toolkit.probe.chunks`: ``Chunk``, ``parse_chunk``, ``check_chunks`` (the future chunks).
- :mod:`~fi_toolkit.probe.kl`: the KL arithmetic (log-sum-exp, reference terms, the negative-KL tolerance).
- :mod:`~fi_toolkit.probe.noise_floor`: the controls, the floor, the flags and the warning, for every command.
- :mod:`~fi_toolkit.probe.forward_influence`: ``Reference``, ``ProbeResult``, ``forward_influence`` and
  its exactness oracle ``forward_influence_by_deletion``.
- :mod:`~fi_toolkit.probe.experiment`: one document's ``fi probe`` job (``probe_document``, ``fi_table``).
- :mod:`~fi_toolkit.probe.selections`: ``--select`` specs -> token sets.
- :mod:`~fi_toolkit.probe.estimator`: the gradient (Fisher) estimate of per-token FI.
"""
