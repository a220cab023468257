"""The command-line tools: each ``engine/tools/<name>.py`` has ``main(argv) -> int``; ``tools/<name>.py``
and the ``<name>`` entry point call it."""
