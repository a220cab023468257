"""Command-line tools, each ``main(argv) -> int``: installed as console commands (``hdf-dump``,
``dump-dataset``, ``make-hostfile``, ``gen-returnn-keys``) and run by the thin scripts in ``tools/``."""
