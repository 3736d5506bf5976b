"""What tools/dist_*.sh run before and around torchrun: the argument checks and the supervision.

``python -m ifnd.launch check ...`` refuses a process count the node cannot run, a missing config
or checkpoint, and a rendezvous port in use, with one line each; ``python -m ifnd.launch run CMD``
runs a launcher and leaves none of its processes behind. Only the device count imports torch:
the other mistakes are reported without waiting seconds for it.
"""
import argparse
import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import time
from typing import NoReturn

# Linux prctl options (linux/prctl.h).
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# What a shell, a terminal or a scheduler sends to stop a job; each is passed on to the launcher.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def fail(message: str, usage: str | None = None) -> NoReturn:
    """End the command with ``error: message``, after the usage line when one is given."""
    if usage:
        print(f'usage: {usage}', file=sys.stderr)
    raise SystemExit(f'error: {message}')


def node_devices() -> tuple[int, str]:
    """How many processes this node can run, and of what: its visible CUDA GPUs, else its CPU cores."""
    import torch  # here, not at the top: the other checks need no torch (seconds to import)

    if torch.cuda.is_available():
        return torch.cuda.device_count(), 'GPU'
    # The cores this process may run on (taskset, cgroup cpusets), not all the machine has.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1
    return cores, 'CPU core'


def positive_int(text: str) -> int | None:
    """``text`` as a whole number of at least 1, else None."""
    return int(text) if text.isascii() and text.isdigit() and int(text) > 0 else None


def check_port(addr: str, port: int, script: str) -> None:
    """Refuse a rendezvous port that torchrun could not listen on at ``addr``, naming a free one."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        fail(f'MASTER_ADDR={addr} does not resolve ({e.strerror}); on one node leave MASTER_ADDR '
             'unset (127.0.0.1)')
    # torchrun's store listens on every address: one listening on the wildcard or on another
    # address of this machine holds the port as well.
    for where in (sockaddr, ('', port) if family == socket.AF_INET else ('::', port)):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            # As the store does: a port of an ended run still in TIME_WAIT can be taken again.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(where)
            except OSError as e:
                if e.errno == errno.EADDRNOTAVAIL:
                    fail(f'MASTER_ADDR={addr} is not an address of this machine; on one node leave '
                         'MASTER_ADDR unset (127.0.0.1)')
                if e.errno != errno.EADDRINUSE:
                    fail(f'cannot listen on {addr}:{port} ({e.strerror}); choose another port: '
                         f'PORT={free_port()} {script} ...')
                fail(f'port {port} on {addr} is in use (another run, or another program); choose '
                     f'another: PORT={free_port()} {script} ...')


def free_port() -> int:
    """A TCP port free on this machine now."""
    with socket.socket() as s:
        s.bind(('', 0))
        return s.getsockname()[1]


def check_launch(args: list[str], usage: str, nnodes: str = '1', addr: str = '127.0.0.1',
                 port: str = '29500') -> None:
    """Refuse ``FILE N`` (``args``, named by ``usage``) and the rendezvous a launch could not run.

    FILE must be a file; N a whole number of processes of at least 1 and at most the node's
    devices (:func:`node_devices`; per node when ``nnodes`` > 1); on one node, ``port`` must be
    free on ``addr``. Each mistake ends the command with one line (after the usage line for the
    arguments) instead of a torchrun traceback, or of forking more processes than the node runs.
    """
    script, file_name, count_name = usage.split()[:3]
    if not args:
        fail(f'{file_name} and {count_name} are missing', usage)
    path = args[0]
    if len(args) < 2:
        fail(f'{count_name} (the number of processes on this node) is missing', usage)
    count = positive_int(args[1])
    if count is None:
        fail(f'{count_name} must be a whole number of processes of at least 1, got {args[1]!r}', usage)
    if os.path.isdir(path):
        fail(f'{file_name} {path} is a folder; pass a file inside it', usage)
    if not os.path.isfile(path):
        fail(f'{file_name} not found: {path}; check the path (relative paths start at the '
             'repository root)', usage)
    nodes = positive_int(nnodes)
    if nodes is None:
        fail(f'NNODES must be a whole number of nodes of at least 1, got {nnodes!r}')
    port_number = positive_int(port)
    if port_number is None or port_number > 65535:
        fail(f'PORT must be a TCP port number (1-65535), got {port!r}')
    if nodes == 1:  # on several nodes the rendezvous is the first node's; only it can check
        check_port(addr, port_number, script)
    available, kind = node_devices()
    if count > available:
        per_node = f' per node (NNODES={nodes})' if nodes > 1 else ''
        fail(f'{count_name}={count} processes{per_node}, but this node has {available} {kind}'
             f'{"s" if available != 1 else ""} (one process each): give {count_name} at most '
             f'{available}', usage)


def _prctl(option: int, value: int) -> bool:
    """Linux prctl(option, value); whether it took (False elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _descendants(root: int) -> list[int]:
    """The live processes under ``root`` (children, theirs, ...), from /proc; none without it."""
    children: dict[int, list[int]] = {}
    for name in os.listdir('/proc') if os.path.isdir('/proc') else []:
        if not name.isdigit():
            continue
        try:
            with open(f'/proc/{name}/stat') as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        # pid (command) state ppid ...: the command may itself hold spaces and parentheses.
        state, ppid = stat[stat.rindex(')') + 2:].split()[:2]
        if state not in 'ZX':  # a zombie has ended: it only waits to be reaped
            children.setdefault(int(ppid), []).append(int(name))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            found.append(pid)
            todo.append(pid)
    return found


def _reap() -> None:
    """Collect the exit status of every ended child (orphans adopted included): no zombies stay."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def end_descendants(grace: float = 10.0) -> list[int]:
    """SIGTERM every process left under this one, SIGKILL those alive ``grace`` s later; their pids."""
    ended: list[int] = []
    deadline = time.monotonic() + grace
    while True:
        _reap()
        left = _descendants(os.getpid())
        if not left:
            return ended
        late = time.monotonic() > deadline
        for pid in left:
            if late or pid not in ended:
                try:
                    os.kill(pid, signal.SIGKILL if late else signal.SIGTERM)
                except ProcessLookupError:
                    pass
                if pid not in ended:
                    ended.append(pid)
        time.sleep(0.1)


def supervise(command: list[str], grace: float = 10.0) -> int:
    """Run the launcher ``command`` to its end, then end whatever it left running; its exit status.

    torchrun starts each worker in a session of its own: a torchrun killed, or failing while it
    starts them, leaves them running, and a signal to its process group misses them. So this
    process adopts every orphan below it (Linux's child subreaper), passes SIGINT, SIGTERM,
    SIGHUP and SIGQUIT on to the launcher (a second one kills it at once), and once it has
    ended, stops each process still under this one (SIGTERM, SIGKILL after ``grace`` s). The
    launcher gets SIGTERM if this process dies first (Linux's parent-death signal).
    """
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    # Its own session: a terminal's Ctrl-C reaches this process alone, which passes it on once.
    launcher = subprocess.Popen(command, start_new_session=True,
                                preexec_fn=lambda: _prctl(PR_SET_PDEATHSIG, signal.SIGTERM))
    received: list[int] = []

    def forward(signum: int, frame) -> None:
        received.append(signum)
        if len(received) == 1:
            launcher.send_signal(signum)
        else:
            print('launch: stopping the launcher and its processes at once', file=sys.stderr)
            launcher.kill()

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        code = launcher.wait()
        left = end_descendants(grace)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if left:
        print(f'launch: ended {len(left)} processes the launcher left running '
              f'(pids {" ".join(map(str, left))})', file=sys.stderr)
    return 128 - code if code < 0 else code  # killed by signal S: 128 + S, as a shell reports it


def main(argv: list[str] | None = None) -> int:
    """Run ``check [options] -- ARGS`` or ``run COMMAND...``; the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ['run']:
        if len(argv) < 2:
            fail('run needs the launcher command to run')
        return supervise(argv[1:])
    parser = argparse.ArgumentParser(prog='python -m ifnd.launch', description=__doc__.split('\n\n')[0])
    sub = parser.add_subparsers(dest='command', required=True)
    check = sub.add_parser('check', help='check a launch script\'s FILE N arguments and its port')
    check.add_argument('--usage', required=True, help="the script's usage, 'SCRIPT FILE N [...]'")
    check.add_argument('--nnodes', default='1', help='NNODES: the port is checked on one node only')
    check.add_argument('--addr', default='127.0.0.1', help='MASTER_ADDR')
    check.add_argument('--port', default='29500', help='PORT: the rendezvous port')
    check.add_argument('args', nargs=argparse.REMAINDER, help="the script's arguments, after --")
    sub.add_parser('run', help='run COMMAND (a launcher); leave none of its processes running')
    args = parser.parse_args(argv)
    check_launch(args.args[1:] if args.args[:1] == ['--'] else args.args, args.usage, args.nnodes,
                 args.addr, args.port)
    return 0


if __name__ == '__main__':
    sys.exit(main())
