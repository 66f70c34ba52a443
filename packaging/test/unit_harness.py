#!/usr/bin/env python3
"""Stands in for systemd (not PID 1 on the build machines) to run an installed unit's own
ExecStartPre= and ExecStart= lines from a throwaway root, as scripts/package-test does:

- a private nats-server on a free loopback port, and the installed configuration edited to use
  it (an operator's edit: insecure test broker, a trivial helper, monitor_port on loopback);
- the unit's command lines with their absolute paths moved into the root, and
  RuntimeDirectory= made as a temporary directory;
- NOTIFY_SOCKET (datagrams read with the sender's credentials, as NotifyAccess=main needs),
  WATCHDOG_USEC from WatchdogSec= and WATCHDOG_PID set to the daemon's own pid.

It checks: ExecStartPre exits 0; READY=1, then a WATCHDOG=1 within WatchdogSec=, all from the
main pid; /readyz 200;
after SIGTERM, STOPPING=1 and exit 0 within TimeoutStopSec=. Every wait is bounded; every
process it starts is stopped by pid.

usage: unit_harness.py ROOT UNIT_NAME NATS_SERVER
"""

import json
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

READY_WITHIN = 30.0
READYZ_WITHIN = 30.0


def fail(message):
    print(f"unit_harness: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_unit(path):
    """The [Service] settings, each a list of its values in order."""
    settings = {}
    section = None
    with open(path) as unit:
        for raw in unit:
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                section = line
                continue
            if section == "[Service]" and "=" in line:
                key, value = line.split("=", 1)
                settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def seconds(value):
    match = re.fullmatch(r"(\d+)(s|min)?", value)
    if not match:
        fail(f"cannot read the time span {value!r}")
    return int(match.group(1)) * (60 if match.group(2) == "min" else 1)


def relocate(argv, root, runtime_dir, runtime_name):
    """Moves each absolute path in argv (alone or after `--flag=`) into the root; the runtime
    directory goes to the stand-in for /run/<RuntimeDirectory>."""
    moved = []
    for arg in argv:
        prefix, path = "", arg
        if arg.startswith("--") and "=" in arg:
            prefix, path = arg.split("=", 1)
            prefix += "="
        if path.startswith(f"/run/{runtime_name}/"):
            path = os.path.join(runtime_dir, path[len(f"/run/{runtime_name}/"):])
        elif path.startswith("/"):
            path = root + path
        moved.append(prefix + path)
    return moved


class NotifySocket:
    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.settimeout(0.2)
        self.lines = []  # (sender pid, line)

    def receive(self):
        try:
            data, ancdata, _flags, _addr = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
        except socket.timeout:
            return
        pid = -1
        for level, kind, cdata in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid, _uid, _gid = struct.unpack("iII", cdata[:12])
        for line in data.decode("utf-8", "replace").splitlines():
            self.lines.append((pid, line))
            print(f"unit_harness: notify from {pid}: {line}")

    def wait_for(self, wanted, within, process, after=-1):
        """Waits for the line `wanted` after the line numbered `after`; returns its number."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for number, (_, line) in enumerate(self.lines):
                if number > after and line == wanted:
                    return number
            if process.poll() is not None:
                fail(f"the daemon exited ({process.returncode}) before {wanted}")
            self.receive()
        fail(f"no {wanted} within {within} s")


def http_status(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return None, ""


def configure(root, nats_port, monitor_port):
    """What an operator does after installing: a choria.cfg, and the sample YAML edited."""
    etc = os.path.join(root, "etc/choria-provisioner")
    with open(os.path.join(etc, "choria.cfg"), "w") as cfg:
        cfg.write(
            f"plugin.choria.middleware_hosts = nats://127.0.0.1:{nats_port}\n"
            "identity = provisioner.package-test\n"
        )
    helper = os.path.join(root, "var/lib/choria-provisioner/helper.sh")
    with open(helper, "w") as script:
        script.write('#!/bin/sh\necho \'{"defer":true,"msg":"package test"}\'\n')
    os.chmod(helper, 0o755)
    yaml_path = os.path.join(etc, "choria-provisioner.yaml")
    with open(yaml_path) as f:
        text = f.read()
    edits = {
        "helper": helper,
        "choria_insecure": "true",
        "monitor_port": str(monitor_port),
        "monitor_address": '"127.0.0.1"',
        "loglevel": "info",
        "workers": "2",
    }
    for key, value in edits.items():
        text, count = re.subn(rf"(?m)^{key}:.*$", f"{key}: {value}", text)
        if count != 1:
            fail(f"the installed {yaml_path} has {count} `{key}:` lines, expected 1")
    with open(yaml_path, "w") as f:
        f.write(text)


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    root, unit_name, nats_binary = sys.argv[1:]
    root = os.path.abspath(root)
    unit = read_unit(os.path.join(root, "usr/lib/systemd/system", unit_name))
    for key, value in (("Type", "notify"), ("NotifyAccess", "main"), ("KillMode", "mixed")):
        if unit.get(key) != [value]:
            fail(f"{key}= is {unit.get(key)}, expected {value}")
    watchdog = seconds(unit["WatchdogSec"][0])
    stop_timeout = seconds(unit["TimeoutStopSec"][0])
    runtime_name = unit["RuntimeDirectory"][0]

    scratch = tempfile.mkdtemp(prefix="unit-harness.")
    runtime_dir = os.path.join(scratch, "run")
    os.mkdir(runtime_dir, 0o755)
    nats_port, monitor_port = free_port(), free_port()
    nats = subprocess.Popen(
        [nats_binary, "-a", "127.0.0.1", "-p", str(nats_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    daemon = None
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", nats_port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or nats.poll() is not None:
                    fail("nats-server did not start")
                time.sleep(0.1)
        configure(root, nats_port, monitor_port)

        notify = NotifySocket(os.path.join(scratch, "notify"))
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "NOTIFY_SOCKET": notify.path,
            "WATCHDOG_USEC": str(watchdog * 1_000_000),
        }
        for pre in unit.get("ExecStartPre", []):
            argv = relocate(shlex.split(pre.lstrip("-")), root, runtime_dir, runtime_name)
            print(f"unit_harness: ExecStartPre: {' '.join(argv)}")
            done = subprocess.run(argv, env=env, timeout=60, capture_output=True, text=True)
            print(done.stdout + done.stderr)
            if done.returncode != 0:
                fail(f"ExecStartPre exited {done.returncode}")

        argv = relocate(shlex.split(unit["ExecStart"][0]), root, runtime_dir, runtime_name)
        print(f"unit_harness: ExecStart: {' '.join(argv)}")
        # WATCHDOG_PID is the daemon's own pid, as systemd sets it: sh learns its pid and execs.
        daemon = subprocess.Popen(
            ["/bin/sh", "-c", 'WATCHDOG_PID=$$; export WATCHDOG_PID; exec "$@"', "sh"] + argv,
            env=env,
            stdout=open(os.path.join(scratch, "daemon.out"), "w"),
            stderr=subprocess.STDOUT,
        )
        ready = notify.wait_for("READY=1", READY_WITHIN, daemon)
        # A ping from the running daemon, not one sent while it was still connecting.
        notify.wait_for("WATCHDOG=1", watchdog, daemon, after=ready)

        deadline = time.monotonic() + READYZ_WITHIN
        while True:
            status, body = http_status(f"http://127.0.0.1:{monitor_port}/readyz")
            if status == 200:
                print(f"unit_harness: /readyz 200 {body}")
                if json.loads(body).get("ready") is not True:
                    fail(f"/readyz 200 without ready: {body}")
                break
            if time.monotonic() > deadline:
                fail(f"/readyz never answered 200 (last {status} {body})")
            if daemon.poll() is not None:
                fail(f"the daemon exited ({daemon.returncode}) before /readyz said 200")
            notify.receive()

        daemon.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1", stop_timeout, daemon_running_or_exited(daemon))
        try:
            code = daemon.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            fail(f"still running {stop_timeout} s after SIGTERM")
        notify.receive()
        if code != 0:
            fail(f"exited {code} after SIGTERM")
        strangers = [(pid, line) for pid, line in notify.lines if pid != daemon.pid]
        if strangers:
            fail(f"datagrams from processes other than the main pid {daemon.pid}: {strangers}")
        print(
            f"unit_harness: ok: ExecStartPre 0, READY=1, WATCHDOG=1, /readyz 200, STOPPING=1,"
            f" exit 0; {len(notify.lines)} lines, all from the main pid"
        )
    finally:
        for process in (daemon, nats):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        if daemon is not None:
            with open(os.path.join(scratch, "daemon.out")) as out:
                tail = out.read()[-4000:]
            print(f"unit_harness: the daemon's output (last 4000 bytes):\n{tail}")
        shutil.rmtree(scratch, ignore_errors=True)


class daemon_running_or_exited:
    """STOPPING=1 may arrive just before the exit: waiting for it must not fail on the exit."""

    def __init__(self, process):
        self.process = process

    def poll(self):
        return None


if __name__ == "__main__":
    main()
