"""A bandwidth-limited link on one machine: a network namespace whose loopback is shaped by tbf.

All ranks started inside it share that one link, like workers behind one slow switch port (see ../shared FACTS).
The namespace is always removed: on exit from the context, at interpreter exit, and on SIGTERM/SIGINT.
"""
import atexit
import contextlib
import os
import shutil
import signal
import subprocess


class NamespaceUnavailable(RuntimeError):
    """Raised with a readable reason where namespaces cannot be created (not root, no iproute2, no tbf)."""


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _delete(name):
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


@contextlib.contextmanager
def shaped_namespace(rate_mbit, name=None):
    """Yield the command prefix (["ip", "netns", "exec", NAME]) of a namespace with lo shaped to rate_mbit."""
    if shutil.which("ip") is None:
        raise NamespaceUnavailable("the 'ip' command (iproute2) is not installed; the link benchmark needs it")
    if os.geteuid() != 0:
        raise NamespaceUnavailable("creating a network namespace needs root (ip netns add); "
                                   "run the link benchmark as root or skip it")
    name = name or f"hvdext-bench-{os.getpid()}"
    created = False

    def cleanup(*_):
        if created:
            _delete(name)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def on_signal(sig, frame):
        cleanup()
        signal.signal(sig, previous[sig])
        os.kill(os.getpid(), sig)

    atexit.register(cleanup)
    for sig in previous:
        signal.signal(sig, on_signal)
    try:
        result = _ip("netns", "add", name, check=False)
        if result.returncode != 0:
            raise NamespaceUnavailable(f"ip netns add failed: {result.stderr.strip()}")
        created = True
        exec_prefix = ["ip", "netns", "exec", name]
        steps = [["ip", "link", "set", "lo", "up"], ["ip", "link", "set", "lo", "mtu", "9000"],
                 # burst must exceed the MTU, or tbf drops large packets for ever (Gloo then times out)
                 ["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", f"{rate_mbit}mbit", "burst", "256kb",
                  "latency", "100ms"]]
        for step in steps:
            r = subprocess.run(exec_prefix + step, capture_output=True, text=True)
            if r.returncode != 0:
                raise NamespaceUnavailable(f"{' '.join(step)} failed in the namespace: {r.stderr.strip()}")
        yield exec_prefix
    finally:
        cleanup()
        created = False
        atexit.unregister(cleanup)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
