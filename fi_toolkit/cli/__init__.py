"""The ``fi`` command line (typer): :mod:`.app` holds the app and ``main``; one module per command group;
the options shared between commands in :mod:`.options`."""
