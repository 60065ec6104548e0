"""The ``fi`` command line (typer): :mod:`.entry` is the console script (it imports :mod:`.app`, which holds
the app and its ``main``); one module per command group; the options shared between commands in :mod:`.options`.

Ctrl-C anywhere is :data:`INTERRUPTED_LINE` on stderr and exit :data:`INTERRUPTED` (the shell's 128 + SIGINT).
"""

INTERRUPTED = 130
INTERRUPTED_LINE = "interrupted: results already written are intact"
