# ddprun's Python hook (see launcher/workers/python_hook.hpp), written by ddprun into its run directory:
# arms faulthandler for ddprun's stack capture, lets PyTorch without libuv use the agent's store,
# then runs the sitecustomize module it shadows.
def _ddprun_arm_stacks():
    import os
    try:
        directory = os.environ.get("DDPRUN_STACK_DIR")
        signum = int(os.environ.get("DDPRUN_STACK_SIGNAL", "0"))
        # Only a worker (the leader of its process group): not its data loader processes.
        if not directory or signum <= 0 or os.getpgid(0) != os.getpid():
            return
        import faulthandler
        out = open(os.path.join(directory, "python.%d.txt" % os.getpid()), "a", buffering=1)
        faulthandler.register(signum, file=out, all_threads=True, chain=False)
        globals()["_ddprun_stack_file"] = out  # kept open for the life of the process
    except Exception:
        pass


def _ddprun_wrap_tcpstore(module):
    real = getattr(module, "TCPStore", None)
    # Only a TCPStore that has the option (PyTorch >= 2.2), and only once.
    if real is None or getattr(real, "_ddprun_wrapped", False) or "use_libuv" not in (real.__init__.__doc__ or ""):
        return

    def TCPStore(*args, **kwargs):
        # PyTorch >= 2.4 defaults use_libuv to True, and one built without libuv refuses it even
        # for a client, which never uses libuv. A client that did not choose gets use_libuv=False
        # (decided before construction: a TCPStore whose construction failed can abort the
        # interpreter when it is freed).
        is_master = kwargs.get("is_master", args[3] if len(args) > 3 else False)
        if not is_master and "use_libuv" not in kwargs:
            kwargs["use_libuv"] = False
        return real(*args, **kwargs)

    TCPStore._ddprun_wrapped = True
    TCPStore.__wrapped__ = real
    module.TCPStore = TCPStore


def _ddprun_hook_agent_store():
    import os
    import sys
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or os.environ.get("DDPRUN_TORCH_HOOK", "1") == "0":
        return
    target = "torch.distributed.rendezvous"
    if target in sys.modules:  # imported already (a worker forked from ddprun's zygote)
        try:
            _ddprun_wrap_tcpstore(sys.modules[target])
        except Exception:
            pass
        return

    class _DdprunFinder:
        @staticmethod
        def find_spec(name, path=None, target_module=None):
            if name != target:
                return None
            import importlib.machinery
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            run = loader.exec_module

            def exec_module(module):
                run(module)
                try:
                    _ddprun_wrap_tcpstore(module)
                except Exception:
                    pass

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _DdprunFinder())


def _ddprun_chain():
    import importlib.machinery
    import importlib.util
    import os
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _ddprun_worker_start():
    # Called by ddprun's zygote (--preload) in each worker it forks, once the worker's environment
    # is in place: what this hook does at an interpreter's start, for that worker.
    _ddprun_arm_stacks()
    _ddprun_hook_agent_store()


_ddprun_arm_stacks()
_ddprun_hook_agent_store()
_ddprun_chain()
