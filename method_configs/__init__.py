"""nerfstudio method specifications provided by odin-ns (installed as ``odin_ns.method_configs``)."""
