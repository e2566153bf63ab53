"""Never imported: the file of compiled attrs methods (:mod:`runtime.attrs_cache`) is kept
as this module's bytecode, so that ``pip uninstall`` (which removes each recorded module's
``.pyc``) removes it too, and ``compileall`` finds it current and leaves it alone."""
