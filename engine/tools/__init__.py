"""The command-line tools' logic (``tools/<name>.py`` and the ``<name-with-dashes>`` entry points call
``engine.tools.<name>.main``)."""
