"""A test helper for the x509 flow (stdlib and the openssl command line): signs the node's CSR
with the CA in argv[1] for argv[2] seconds (openssl ca -startdate/-enddate: openssl x509 counts
whole days only), for CN and DNS:<identity>, and configures the node for the brokers argv[3]."""
import datetime, json, os, subprocess, sys, tempfile
def main():
    ca_dir, life, brokers = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    req = json.load(sys.stdin)
    identity = req["identity"]
    csr = req["csr"]["csr"]
    ssldir = req["csr"].get("ssldir") or "/etc/choria/ssl"
    now = datetime.datetime.now(datetime.timezone.utc)
    fmt = "%Y%m%d%H%M%SZ"
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "index.txt"), "w").close()
        with open(os.path.join(d, "serial"), "w") as f:
            f.write("%016x\n" % int.from_bytes(os.urandom(8), "big"))
        with open(os.path.join(d, "csr.pem"), "w") as f:
            f.write(csr)
        with open(os.path.join(d, "ca.cnf"), "w") as f:
            f.write("[ca]\ndefault_ca=d\n[d]\ndatabase=%s/index.txt\nnew_certs_dir=%s\nserial=%s/serial\n"
                    "default_md=sha256\npolicy=p\nx509_extensions=e\nunique_subject=no\n[p]\ncommonName=supplied\n"
                    "[e]\nsubjectAltName=DNS:%s\n" % (d, d, d, identity))
        subprocess.run(["openssl", "ca", "-batch", "-notext", "-config", os.path.join(d, "ca.cnf"),
                        "-cert", os.path.join(ca_dir, "ca.pem"), "-keyfile", os.path.join(ca_dir, "ca-key.pem"),
                        "-in", os.path.join(d, "csr.pem"), "-out", os.path.join(d, "cert.pem"),
                        "-subj", "/CN=" + identity,
                        "-startdate", (now - datetime.timedelta(seconds=5)).strftime(fmt),
                        "-enddate", (now + datetime.timedelta(seconds=life)).strftime(fmt)],
                       check=True, capture_output=True, timeout=10)
        cert = open(os.path.join(d, "cert.pem")).read()
    ca = open(os.path.join(ca_dir, "ca.pem")).read()
    print("x509 short-life helper: signed %s for %d s" % (json.dumps(identity), life), file=sys.stderr)
    json.dump({"certificate": cert, "ca": ca, "ssldir": ssldir, "configuration": {
        "identity": identity, "plugin.choria.server.provision": "false",
        "plugin.choria.middleware_hosts": brokers}}, sys.stdout)
main()
