#!/usr/bin/env python3
"""Small tools scripts/demo needs that bash does poorly. Standard library only.

    demo-tools.py free-port
        Prints a TCP port that is free on this machine right now (never 4222, the usual
        broker port).

    demo-tools.py progress URL [renewal]
        Prints one line of the provisioner's counters from its /metrics endpoint at URL
        (provisioned, queued, busy workers, errors; with renewal, renewals sent and succeeded
        and in flight); exits 1 if it does not answer within 2 s.

    demo-tools.py ready URL
        Exits 0 if GET URL (the provisioner's /readyz) answers 200 within 2 s, else 1: ready
        means connected and subscribed to startup events, whatever the log level.

    demo-tools.py check-report FILE NODES [EXIT_REASON]
        Reads the simulator's JSON report and exits 0 only if all NODES nodes are in service,
        the run ended for EXIT_REASON (default done: every node was done; renewed: every node
        was renewed), and there were no protocol violations, no duplicate provisioning and no
        failed key or server JWT checks; otherwise prints each problem to stderr and exits 1.

    demo-tools.py renewal-summary FILE NODES START-END URL [AUDIT]
        The summary of scripts/demo --renewal, from the simulator's JSON report FILE and the
        provisioner's /metrics at URL: how many of the NODES nodes got a new credential before
        their first one expired (and which did not), when each was asked as a percentage of
        that credential's lifetime, against the window START-END (percent), with a histogram,
        and the provisioner's renewal metrics; with AUDIT, the provisioner's audit trail, its
        renewal lines by outcome and how late the requests left against their drawn times.
        Exits 0 only if every node was renewed before expiry.
"""

import json
import re
import socket
import sys
import time
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


def progress(url, renewal=False):
    totals = metrics(url)
    if totals is None:
        return 1
    value = lambda name: int(totals.get("choria_provisioner_" + name, 0))
    errors = sum(value(kind + "_errors") for kind in ("rpc", "helper", "provision", "discovery"))
    line = "provisioned %d, queued %d, busy workers %d, errors %d" % (
        value("provisioned"),
        value("work_queue_entries"),
        value("busy_workers"),
        errors,
    )
    if renewal:
        line += "; renewals sent %d, succeeded %d, in flight %d" % (
            value("renewals_sent"),
            value("renewals_succeeded"),
            value("renewals_in_flight"),
        )
    print(line)
    return 0


def ready(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return 0 if response.status == 200 else 1
    except OSError:
        # 503 (not ready yet) arrives as HTTPError, an OSError, as does a refused connection.
        return 1


def check_report(path, nodes, want_exit="done"):
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
    if exit_reason != want_exit:
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


def series(url):
    """Every series at url as (name, labels, value); None if the endpoint does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            text = response.read().decode("utf-8", "replace")
    except OSError as err:
        print("demo-tools: %s: %s" % (url, err), file=sys.stderr)
        return None
    found = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        labels = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        try:
            found.append((name, labels, float(value)))
        except ValueError:
            pass
    return found


def histogram(offsets, life, start, end, width=40):
    """Lines of a text histogram of the ask times, offsets in whole seconds from the issue of
    credentials that live life seconds, over the window start-end (percent). The bins are
    whole seconds wide (about a tenth of the window), so each holds as many possible ask
    times as the next; the few a second outside the window count in the bin at its edge."""
    first = life * start / 100.0
    span = max(1.0, life * (end - start) / 100.0)
    step = max(1, -(-int(span) // 10))
    count = max(1, int(span // step))
    bins = [0] * count
    for offset in offsets:
        bins[min(max(int((offset - first) // step), 0), count - 1)] += 1
    most = max(bins) or 1
    lines = []
    for i, n in enumerate(bins):
        low = 100.0 * (first + i * step) / life
        high = 100.0 * (first + (i + 1) * step) / life if i < count - 1 else end
        bar = "#" * (0 if n == 0 else max(1, round(n * width / most)))
        lines.append("demo:   %4.1f-%4.1f %% | %-*s %d" % (low, high, width, bar, n))
    return lines


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def audit_summary(path):
    """One line on the renewal lines of the audit trail at path, None if it cannot be read."""
    outcomes, late = {}, []
    try:
        with open(path) as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("event") != "renewal":
                    continue
                outcome = entry.get("outcome", "?")
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                if outcome == "asked" and isinstance(entry.get("late_ms"), int):
                    late.append(entry["late_ms"])
    except OSError:
        return None
    text = ", ".join("%d %s" % (n, o) for o, n in sorted(outcomes.items())) or "no renewal lines"
    if late:
        text += "; requests left %d ms after their drawn time (p99; at most %d ms)" % (
            percentile(late, 0.99),
            max(late),
        )
    return "audit trail: " + text


def renewal_summary(path, nodes, window, url, audit=None):
    say = lambda line: print("demo: " + line, file=sys.stderr)
    try:
        with open(path) as f:
            report = json.load(f)
        fleet = report["nodes"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        say("cannot read the simulator's report %s: %s" % (path, err))
        return 1
    start, end = window
    renewed, late, outside, percents, lead, turnaround = [], [], [], [], [], []
    lives, offsets = {}, {}
    for node in fleet:
        ident = node.get("identity", "?")
        # NodeReport flattens its record into the node's object.
        creds = node.get("credentials", [])
        first = creds[0] if creds else {}
        nb, na, asked = first.get("not_before"), first.get("not_after"), first.get("renewal_asked_at")
        if nb is None or na is None or na <= nb:
            late.append("%s: no server JWT with a lifetime recorded" % ident)
            continue
        lives[na - nb] = lives.get(na - nb, 0) + 1
        if asked is None:
            late.append("%s: never asked to reprovision" % ident)
            continue
        if len(creds) < 2:
            late.append("%s: asked %d s before expiry, never given a new credential" % (ident, na - asked))
            continue
        given = creds[1]["given_at"]
        if given > na:
            late.append("%s: its new credential came %ds after expiry" % (ident, given - na))
            continue
        renewed.append(ident)
        percent = 100.0 * (asked - nb) / (na - nb)
        percents.append(percent)
        offsets.setdefault(na - nb, []).append(asked - nb)
        # Whole seconds: a second of slack at each edge.
        if not (nb + (na - nb) * start / 100 - 1 <= asked <= nb + (na - nb) * end / 100 + 1):
            outside.append("%s at %.1f %%" % (ident, percent))
        lead.append(na - given)
        turnaround.append(given - asked)
    lifetimes = "/".join("%d s" % s for s in sorted(lives)) or "?"
    say(
        "renewal: %d of %d nodes renewed before their server JWT (%s) expired"
        % (len(renewed), nodes, lifetimes)
    )
    for line in late[:20]:
        say("  NOT renewed in time: " + line)
    if len(late) > 20:
        say("  ... and %d more" % (len(late) - 20))
    if percents:
        say(
            "  asked at %.1f %% to %.1f %% of the lifetime (median %.1f %%; window %d-%d %%, %d outside it)"
            % (min(percents), max(percents), percentile(percents, 0.5), start, end, len(outside))
        )
        for line in outside[:10]:
            say("  outside the window: " + line)
        say(
            "  new credential %d s after the ask (median; at most %d s); the closest came %d s before expiry"
            % (percentile(turnaround, 0.5), max(turnaround), min(lead))
        )
        # Over the credentials of the most common lifetime (the demo's are all alike).
        life = max(offsets, key=lambda l: len(offsets[l]))
        for line in histogram(offsets[life], life, start, end):
            print(line, file=sys.stderr)
    found = series(url)
    if found is not None:
        total = lambda name: sum(v for n, _, v in found if n == "choria_provisioner_" + name)
        by = lambda name, label: ", ".join(
            "%s %d" % (l.get(label, "?"), v)
            for n, l, v in found
            if n == "choria_provisioner_" + name and v
        ) or "none"
        earliest = total("renewal_earliest_expiry")
        say(
            "  provisioner: renewals sent %d, succeeded %d, in flight %d; failed: %s; skipped: %s"
            % (total("renewals_sent"), total("renewals_succeeded"), total("renewals_in_flight"),
               by("renewals_failed", "reason"), by("renewals_skipped", "reason"))
        )
        say(
            "  provisioner: %d records, store ready %d, store errors %d, records dropped %d; "
            "expiring within %s; earliest expiry in %s"
            % (total("renewal_records"), total("renewal_store_ready"), total("renewal_store_errors"),
               total("renewal_records_dropped"),
               ", ".join("%s: %d" % (l.get("within"), v) for n, l, v in found
                         if n == "choria_provisioner_renewal_expiring") or "?",
               "%d s" % (earliest - time.time()) if earliest else "(none)")
        )
    if audit:
        line = audit_summary(audit)
        if line:
            say("  " + line)
    return 0 if len(renewed) == nodes and not late else 1


def main(argv):
    if len(argv) == 1 and argv[0] == "free-port":
        return free_port()
    if len(argv) == 2 and argv[0] == "progress":
        return progress(argv[1])
    if len(argv) == 3 and argv[0] == "progress" and argv[2] == "renewal":
        return progress(argv[1], renewal=True)
    if len(argv) == 2 and argv[0] == "ready":
        return ready(argv[1])
    if len(argv) in (3, 4) and argv[0] == "check-report" and argv[2].isdigit():
        return check_report(argv[1], int(argv[2]), *argv[3:])
    window = re.fullmatch(r"(\d+)-(\d+)", argv[3]) if len(argv) in (5, 6) else None
    if window and argv[0] == "renewal-summary" and argv[2].isdigit():
        start, end = int(window.group(1)), int(window.group(2))
        return renewal_summary(argv[1], int(argv[2]), (start, end), argv[4], *argv[5:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
