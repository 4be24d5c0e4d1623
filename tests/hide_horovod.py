"""Make every import of Horovod fail in this process (horovod_ext.ddp and the core must not need it)."""
import sys


class HiddenHorovod:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "horovod" or name.startswith("horovod."):
            raise ImportError("Horovod is hidden: this process must not need it")


def hide():
    if HiddenHorovod not in sys.meta_path:
        sys.meta_path.insert(0, HiddenHorovod)
