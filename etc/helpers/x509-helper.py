#!/usr/bin/env python3
"""Sample choria-provisioner helper for the x509 flow: signs each node's CSR with a local CA.

Use with `features: {pki: true}`, e.g.

    helper: /etc/choria-provisioner/helpers/x509-helper.py --ca-dir /etc/choria-provisioner/ca --brokers nats://broker.example.net:4222

The CA directory holds `ca.pem` (the CA certificate) and `ca-key.pem` (its unencrypted private
key, readable only by the provisioner's user). Signing uses the `openssl` command line (OpenSSL
3.0 or later). Make a test CA with:

    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca-key.pem -out ca.pem -days 3650 -subj "/CN=Choria Test CA"

The provisioner runs this program once per node and talks to it over stdin and stdout. With
`--serve` (for `helper_mode: persistent`) it runs on instead, reading one request per line
and writing one answer per line: the same objects, each with the request's "id" echoed.

stdin: one JSON object describing the node
    identity        the node's identity (string)
    csr             {csr, public_key, ssldir}: the CSR the node made (CN = identity, already
                    checked by the provisioner against cert_deny_list) and its SSL directory
    ed25519_pubkey  null in this flow
    inventory       the node's rpcutil#inventory reply, as a JSON document in a string
    jwt             the node's verified provisioning JWT claims (object) with features.jwt, or null

stdout: one JSON object; every key is optional
    defer           true: do not provision now; msg says why (the node is retried later)
    shutdown        true: shut the node down instead of provisioning it
    msg             a message for the provisioner's log
    certificate     the signed certificate (PEM), written to <ssldir>/certificate.pem
    ca              the CA certificate (PEM), written to <ssldir>/ca.pem
    ssldir          where they go (the node's own ssldir from gencsr wins)
    key             a private key (PEM) to install instead of the node's own; sent encrypted,
                    needs features.jwt; not used here
    configuration   string -> string: the node's new server.conf settings (required to provision)
    action_policies, opa_policies   file name -> policy text; upgrade: a Choria version to move to

A non-zero exit, no output or undecodable output fails the node; so does running longer than
`helper_timeout`. Diagnostics go to stderr, which the provisioner logs tagged with the node,
a line at a time: anything the node sent is written there only through json.dumps, so a
newline or another line break in it cannot start a line of its own that reads like one of
the provisioner's.

The node is untrusted: it chose its identity and wrote its CSR. So the certificate is built from
the identity alone, and only from an identity that is a plain DNS name (letters, digits, `-`
and `_` in dot-separated labels, at most 255 bytes): its subject is exactly `CN=<identity>` and
its subjectAltName exactly `DNS:<identity>`, whatever else the CSR asks for. Anything else is
deferred with the reason, so a node named `n1,DNS:broker.example.net` gets no certificate for
the broker's name.

Settings, from arguments or the environment (arguments win):
    --ca-dir / CHORIA_HELPER_CA_DIR   the CA directory (default /etc/choria-provisioner/ca)
    --brokers / CHORIA_BROKERS        plugin.choria.middleware_hosts (default nats://broker.example.net:4222)
    --days / CHORIA_CERT_DAYS         certificate validity in days (default 365)
    --openssl / OPENSSL               the openssl binary (default: openssl on PATH)
"""

import argparse
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile


def log(message):
    """One line on stderr. Node text goes in only as quoted(...) makes it."""
    print("x509-helper: " + message, file=sys.stderr)


def quoted(text):
    """A value a node sent, as one line of ASCII: json.dumps escapes every control and
    non-ASCII character (U+0085, U+2028 and U+2029 among them)."""
    return json.dumps(text)


# A DNS name: dot-separated labels of letters, digits, '-' and '_'; no empty label.
IDENTITY = re.compile(r"\A[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\Z")


def identity_problem(identity):
    """Why `identity` cannot name a certificate, or None when it can."""
    if not isinstance(identity, str) or not identity:
        return "no identity received"
    if len(identity.encode("utf-8")) > 255:
        return "the identity is longer than 255 bytes"
    if not IDENTITY.match(identity):
        return "the identity %s is not a plain DNS name" % json.dumps(identity)
    return None


def settings(argv):
    parser = argparse.ArgumentParser(description="choria-provisioner x509 helper")
    parser.add_argument(
        "--ca-dir",
        default=os.environ.get("CHORIA_HELPER_CA_DIR", "/etc/choria-provisioner/ca"),
    )
    parser.add_argument(
        "--brokers",
        default=os.environ.get("CHORIA_BROKERS", "nats://broker.example.net:4222"),
    )
    parser.add_argument("--days", type=int, default=int(os.environ.get("CHORIA_CERT_DAYS", "365")))
    parser.add_argument("--openssl", default=os.environ.get("OPENSSL", "openssl"))
    return parser.parse_args(argv)


def defer(reason):
    return {"defer": True, "msg": reason}


def openssl(opts, args, stdin=None):
    done = subprocess.run(
        [opts.openssl] + args,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=5,
    )
    if done.returncode != 0:
        raise RuntimeError("openssl %s failed: %s" % (args[0], done.stderr.strip()))
    return done.stdout


def sign(opts, identity, csr_pem):
    ca_cert = os.path.join(opts.ca_dir, "ca.pem")
    ca_key = os.path.join(opts.ca_dir, "ca-key.pem")
    for path in (ca_cert, ca_key):
        if not os.path.isfile(path):
            raise RuntimeError("CA file %s does not exist (see --ca-dir)" % path)
    with tempfile.TemporaryDirectory(prefix="x509-helper-") as work:
        csr_file = os.path.join(work, "node.csr")
        ext_file = os.path.join(work, "ext.cnf")
        with open(csr_file, "w") as f:
            f.write(csr_pem)
        # The provisioner does not check the CSR's self-signature; we do before signing.
        openssl(opts, ["req", "-in", csr_file, "-noout", "-verify"])
        # The subject and the SAN come from the checked identity alone: the CSR's own subject
        # and extensions are ignored (-subj, -copy_extensions none).
        with open(ext_file, "w") as f:
            f.write("basicConstraints = CA:FALSE\n")
            f.write("keyUsage = digitalSignature, keyEncipherment\n")
            f.write("extendedKeyUsage = serverAuth, clientAuth\n")
            f.write("subjectAltName = DNS:%s\n" % identity)
        # A random serial per certificate: helpers run in parallel, so no shared serial file.
        serial = "0x" + secrets.token_hex(16)
        return openssl(
            opts,
            [
                "x509", "-req", "-in", csr_file,
                "-CA", ca_cert, "-CAkey", ca_key, "-set_serial", serial,
                "-days", str(opts.days), "-sha256", "-extfile", ext_file,
                "-subj", "/CN=" + identity, "-copy_extensions", "none",
            ],
        )


def answer(node, opts):
    identity = node.get("identity")
    problem = identity_problem(identity)
    if problem:
        return defer("refusing to sign: " + problem)
    csr = node.get("csr") or {}
    if not csr.get("csr"):
        return defer("no CSR received: is features.pki enabled?")
    ssldir = (csr.get("ssldir") or "/etc/choria/ssl").rstrip("/")

    certificate = sign(opts, identity, csr["csr"])
    with open(os.path.join(opts.ca_dir, "ca.pem")) as f:
        ca = f.read()

    configuration = {
        "identity": identity,
        "loglevel": "info",
        "plugin.choria.server.provision": "false",
        "plugin.choria.middleware_hosts": opts.brokers,
        "plugin.security.provider": "file",
        "plugin.security.file.certificate": ssldir + "/certificate.pem",
        "plugin.security.file.key": ssldir + "/private.pem",
        "plugin.security.file.ca": ssldir + "/ca.pem",
    }
    log("signed a certificate for %s valid %d days" % (quoted(identity), opts.days))
    return {
        "defer": False,
        "msg": "certificate signed by the x509 sample helper",
        "certificate": certificate,
        "ca": ca,
        "ssldir": ssldir,
        "configuration": configuration,
    }


def reply_for(node, opts):
    try:
        return answer(node, opts)
    except Exception as err:  # any surprise defers the node with the reason in the log
        return defer("unexpected failure in the x509 helper: %s: %s" % (type(err).__name__, err))


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
        reply = defer("unexpected failure in the x509 helper: %s: %s" % (type(err).__name__, err))
    if node is not None:
        reply = reply_for(node, opts)
    json.dump(reply, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
