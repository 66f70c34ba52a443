#!/usr/bin/env python3
"""Small tools scripts/demo needs that bash does poorly. Standard library only.

    demo-tools.py free-port
        Prints a TCP port that is free on this machine right now (never 4222, the usual
        broker port).

    demo-tools.py progress URL
        Prints one line of the provisioner's counters from its /metrics endpoint at URL
        (provisioned, queued, busy workers, errors); exits 1 if it does not answer within 2 s.

    demo-tools.py ready URL
        Exits 0 if GET URL (the provisioner's /readyz) answers 200 within 2 s, else 1: ready
        means connected and subscribed to startup events, whatever the log level.

    demo-tools.py check-report FILE NODES
        Reads the simulator's JSON report and exits 0 only if all NODES nodes are in service,
        the run ended because every node was done, and there were no protocol violations, no
        duplicate provisioning and no failed key or server JWT checks; otherwise prints each
        problem to stderr and exits 1.
"""

import json
import socket
import sys
import urllib.request

# The well-known client port: a broker there is not ours, and the demo never uses it.
BROKER_PORT = 4222


def free_port():
    for _ in range(20):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # Bind on all interfaces: the provisioner's monitor port listens on 0.0.0.0.
            s.bind(("0.0.0.0", 0))
            port = s.getsockname()[1]
        if port != BROKER_PORT:
            print(port)
            return 0
    print("demo-tools: no free port found", file=sys.stderr)
    return 1


def metrics(url):
    """Every metric at url, summed over its label sets; None if the endpoint does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            text = response.read().decode("utf-8", "replace")
    except OSError as err:
        print("demo-tools: %s: %s" % (url, err), file=sys.stderr)
        return None
    totals = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        name = series.split("{", 1)[0]
        try:
            totals[name] = totals.get(name, 0.0) + float(value)
        except ValueError:
            pass
    return totals


def progress(url):
    totals = metrics(url)
    if totals is None:
        return 1
    value = lambda name: int(totals.get("choria_provisioner_" + name, 0))
    errors = sum(value(kind + "_errors") for kind in ("rpc", "helper", "provision", "discovery"))
    print(
        "provisioned %d, queued %d, busy workers %d, errors %d"
        % (value("provisioned"), value("work_queue_entries"), value("busy_workers"), errors)
    )
    return 0


def ready(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return 0 if response.status == 200 else 1
    except OSError:
        # 503 (not ready yet) arrives as HTTPError, an OSError, as does a refused connection.
        return 1


def check_report(path, nodes):
    try:
        with open(path) as f:
            report = json.load(f)
        totals = report["totals"]
        exit_reason = report["exit_reason"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        print("demo: cannot read the simulator's report %s: %s" % (path, err), file=sys.stderr)
        return 1
    problems = []
    if totals.get("nodes") != nodes:
        problems.append("the fleet had %s nodes, expected %d" % (totals.get("nodes"), nodes))
    if totals.get("in_service") != nodes:
        problems.append("%s of %d nodes provisioned" % (totals.get("in_service"), nodes))
    if exit_reason != "done":
        problems.append("the simulator stopped early (%s)" % exit_reason)
    for key, what in (
        ("violations", "protocol violations"),
        ("duplicates", "nodes provisioned twice"),
        ("key_checks_failed", "failed key checks"),
        ("server_jwt_checks_failed", "failed server JWT checks"),
    ):
        if totals.get(key, 0) != 0:
            problems.append("%s %s" % (totals.get(key), what))
    for problem in problems:
        print("demo: FAILED: " + problem, file=sys.stderr)
    return 1 if problems else 0


def main(argv):
    if len(argv) == 1 and argv[0] == "free-port":
        return free_port()
    if len(argv) == 2 and argv[0] == "progress":
        return progress(argv[1])
    if len(argv) == 2 and argv[0] == "ready":
        return ready(argv[1])
    if len(argv) == 3 and argv[0] == "check-report" and argv[2].isdigit():
        return check_report(argv[1], int(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
