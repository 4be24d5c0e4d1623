"""A bandwidth-limited link on one machine: run a command (horovodrun and its ranks) inside a network namespace
whose loopback is shaped by tbf, to see what compression does on the link it is for.

    python benchmarks/shaped_link.py --mbit 100 -- horovodrun -np 2 -H localhost:2 --gloo python train.py
    python benchmarks/shaped_link.py --mbit 100 --or-unshaped -- ...   # where no namespace can be made, say why
                                                                      # and run the command on plain loopback

All ranks started inside it share that one link, like workers behind one slow switch port. It needs root and
iproute2 (ip netns, tc tbf). The namespace is always removed: on exit from the context, at interpreter exit, and on
SIGTERM/SIGINT. The benchmarks (benchmarks/link.py, tta.py, gravac.py, coding.py) use shaped_namespace().
"""
import argparse
import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys


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
        raise NamespaceUnavailable("the 'ip' command (iproute2) is not installed")
    if os.geteuid() != 0:
        raise NamespaceUnavailable("creating a network namespace needs root (ip netns add)")
    name = name or f"hvdext-link-{os.getpid()}"
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


def main(argv=None):
    parser = argparse.ArgumentParser(prog="benchmarks/shaped_link.py",
                                     description="Run a command inside a network namespace whose loopback is shaped "
                                                 "to a slow link (root).")
    parser.add_argument("--mbit", type=float, default=100.0, help="the link's rate in Mbit/s (default 100)")
    parser.add_argument("--or-unshaped", action="store_true",
                        help="where no namespace can be made, say why and run the command unshaped")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: python benchmarks/shaped_link.py --mbit 100 -- horovodrun ...")
    if args.mbit <= 0:
        parser.error(f"--mbit must be > 0, got {args.mbit}")
    rate = f"{args.mbit:g}"
    try:
        with shaped_namespace(rate) as prefix:
            print(f"[shaped_link] loopback shaped to {rate} Mbit/s in a network namespace (removed at exit)",
                  flush=True)
            return subprocess.call(prefix + command)
    except NamespaceUnavailable as exc:
        if not args.or_unshaped:
            print(f"[shaped_link] cannot shape a link here: {exc}", file=sys.stderr)
            return 2
        print(f"[shaped_link] cannot shape a link here ({exc}): running on plain loopback instead, where "
              f"communication is nearly free and compression shows its bytes, not its speed", flush=True)
        return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
