#!/usr/bin/env python3
"""Sample choria-provisioner helper for the ed25519 flow (Organization Issuer networks).

Use with `features: {ed25519: true}` (which turns on `jwt`), e.g.

    helper: /etc/choria-provisioner/helpers/ed25519-helper.py --issuer 3899a8bb...67730 --brokers nats://broker.example.net:4222

The provisioner runs this program once per node and talks to it over stdin and stdout. With
`--serve` (for `helper_mode: persistent`) it runs on instead, reading one request per line
and writing one answer per line: the same objects, each with the request's "id" echoed.

stdin: one JSON object describing the node
    identity        the node's identity (string)
    csr             null in this flow ({csr, public_key, ssldir} with features.pki)
    ed25519_pubkey  {public_key, directory, signature}: the node's new ed25519 key (hex) and
                    the directory holding its server.seed; the provisioner has already checked
                    the signature
    inventory       the node's rpcutil#inventory reply, as a JSON document in a string
    jwt             the node's verified provisioning JWT claims (object), or null

stdout: one JSON object; every key is optional
    defer           true: do not provision now; msg says why (the node is retried later)
    shutdown        true: shut the node down instead of provisioning it
    msg             a message for the provisioner's log
    configuration   string -> string: the node's new server.conf settings (required to provision)
    server_claims   overrides for the server JWT the provisioner issues: ou, exp (absolute unix
                    time), collectives, pub_subjects, permissions {submission, streams,
                    governor, service_host}
    certificate, ca, ssldir, key, action_policies, opa_policies, upgrade: see the x509 helper
                    and the README; unused here

A non-zero exit, no output or undecodable output fails the node; so does running longer than
`helper_timeout`. Diagnostics go to stderr, which the provisioner logs tagged with the node,
a line at a time: anything the node sent (its identity, its inventory) is written there only
through json.dumps, so a newline or another line break in it cannot start a line of its own
that reads like one of the provisioner's.

Settings, from arguments or the environment (arguments win):
    --issuer / CHORIA_ISSUER_PUBLIC     the Organization Issuer's ed25519 public key (hex), required
    --brokers / CHORIA_BROKERS          plugin.choria.middleware_hosts (default nats://broker.example.net:4222)
    --collectives / CHORIA_COLLECTIVES  collectives, comma separated (default: the server's own default)
    --validity-days / CHORIA_SERVER_JWT_DAYS
                                        server JWT validity in days (default: the provisioner's
                                        server_jwt_validity)
    --permissions / CHORIA_SERVER_PERMISSIONS
                                        server JWT permissions, comma separated, from
                                        submission, streams, governor, service_host
"""

import argparse
import json
import os
import re
import sys
import time

PERMISSIONS = ("submission", "streams", "governor", "service_host")


def log(message):
    """One line on stderr. Node text goes in only as quoted(...) makes it."""
    print("ed25519-helper: " + message, file=sys.stderr)


def quoted(text):
    """A value a node sent, as one line of ASCII: json.dumps escapes every control and
    non-ASCII character (U+0085, U+2028 and U+2029 among them)."""
    return json.dumps(text)


def settings(argv):
    parser = argparse.ArgumentParser(description="choria-provisioner ed25519 helper")
    parser.add_argument("--issuer", default=os.environ.get("CHORIA_ISSUER_PUBLIC", ""))
    parser.add_argument(
        "--brokers",
        default=os.environ.get("CHORIA_BROKERS", "nats://broker.example.net:4222"),
    )
    parser.add_argument("--collectives", default=os.environ.get("CHORIA_COLLECTIVES", ""))
    parser.add_argument(
        "--validity-days",
        type=float,
        default=float(os.environ.get("CHORIA_SERVER_JWT_DAYS", "0") or 0),
    )
    parser.add_argument(
        "--permissions", default=os.environ.get("CHORIA_SERVER_PERMISSIONS", "")
    )
    return parser.parse_args(argv)


def defer(reason):
    return {"defer": True, "msg": reason}


def answer(node, opts):
    identity = node.get("identity") or ""
    if not identity:
        return defer("no identity received")
    if not re.fullmatch(r"[0-9a-fA-F]{64}", opts.issuer or ""):
        return defer("the helper needs --issuer (or CHORIA_ISSUER_PUBLIC): 64 hex characters")
    ed = node.get("ed25519_pubkey") or {}
    if not ed.get("public_key") or not ed.get("directory"):
        return defer("no ed25519 public key received: is features.ed25519 enabled?")

    directory = ed["directory"].rstrip("/")
    configuration = {
        "identity": identity,
        "loglevel": "info",
        "plugin.choria.server.provision": "false",
        "plugin.choria.middleware_hosts": opts.brokers,
        "plugin.security.provider": "choria",
        "plugin.security.issuer.names": "choria",
        "plugin.security.issuer.choria.public": opts.issuer.lower(),
        "plugin.security.choria.token_file": directory + "/server.jwt",
        "plugin.security.choria.seed_file": directory + "/server.seed",
    }
    if opts.collectives:
        configuration["collectives"] = opts.collectives

    reply = {"defer": False, "msg": "configured by the ed25519 sample helper", "configuration": configuration}

    claims = {}
    if opts.validity_days > 0:
        # exp is an absolute unix time; the provisioner ignores anything under an hour from now.
        claims["exp"] = int(time.time() + opts.validity_days * 86400)
    wanted = [p.strip() for p in opts.permissions.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in PERMISSIONS]
    if unknown:
        return defer("unknown server permissions: " + ", ".join(unknown))
    if wanted:
        claims["permissions"] = {p: True for p in wanted}
    if claims:
        reply["server_claims"] = claims

    inventory = json.loads(node.get("inventory") or "{}")
    log("%s runs Choria %s" % (quoted(identity), quoted(inventory.get("version", "(unknown version)"))))
    return reply


def reply_for(node, opts):
    try:
        return answer(node, opts)
    except Exception as err:  # any surprise defers the node with the reason in the log
        return defer("unexpected failure in the ed25519 helper: %s: %s" % (type(err).__name__, err))


def serve(opts):
    """helper_mode: persistent: one JSON request per line, one JSON answer per line echoing
    its "id", until stdin closes."""
    for line in sys.stdin:
        try:
            node = json.loads(line)
            request_id = node["id"]
        except (ValueError, KeyError, TypeError) as err:
            # Without the id there is no answer to give: exit, the provisioner restarts us.
            log("unreadable request line (%s); exiting" % quoted(str(err)))
            sys.exit(1)
        reply = reply_for(node, opts)
        reply["id"] = request_id
        sys.stdout.write(json.dumps(reply, separators=(",", ":")) + "\n")
        sys.stdout.flush()


def main():
    argv = sys.argv[1:]
    if "--serve" in argv:
        argv.remove("--serve")
        serve(settings(argv))
        return
    opts = settings(argv)
    try:
        node = json.load(sys.stdin)
    except ValueError as err:
        node = None
        reply = defer("unexpected failure in the ed25519 helper: %s: %s" % (type(err).__name__, err))
    if node is not None:
        reply = reply_for(node, opts)
    json.dump(reply, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
