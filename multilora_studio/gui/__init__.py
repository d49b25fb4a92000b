"""PySide6 desktop window over the engine, the adapter library and the server.

The only package that imports Qt. Importing this package itself does not: the
command line (``multilora_studio.cli.gui``) imports it only when the window opens.
"""
