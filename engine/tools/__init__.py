"""Command-line tools: each ``engine/tools/<name>.py`` has ``main(argv) -> int``, installed as a console
command (``hdf-dump``, ``dump-dataset``, ``make-hostfile``, ``supervise``, ...) and run by the thin
``tools/<name>.py`` scripts.

Stage 8 (tools): may import every stage below; only ``engine/main.py`` is above it.
"""
