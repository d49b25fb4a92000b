"""PySide6 desktop window over the engine, the adapter library and the server.

The only package that imports Qt. Importing this package itself does not: the
command line imports ``multilora_studio.gui.command`` without loading Qt.
"""
