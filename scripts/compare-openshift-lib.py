"""Shared pieces of scripts/compare-openshift and scripts/openshift-pki-dump: a real etcd +
kube-apiserver on 127.0.0.1 (from ../shared/envtest), the cluster objects OpenShift's operator
needs (../shared/openshift), a tiny JSON API client, processes with CPU/RSS accounting, the
audit log per user, and openssl helpers (including certificates dated in the past, which
`openssl x509` cannot make: `openssl ca` with -startdate/-enddate can).

Python stdlib + the openssl and kubectl CLIs only.
"""

import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024

# Users in tokens.csv: one per process that talks to the API, so the audit log says who did what.
USERS = ["admin", "ours-sync", "ours-regen", "theirs-sync", "theirs-regen"]


def log(msg):
    print(msg, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, **kw):
    """Run a command; on failure raise with its stderr (the script refuses to go on)."""
    kw.setdefault("timeout", 120)
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    return p.stdout


def wait_for(what, pred, timeout, interval=0.05):
    """Poll `pred` until it returns a truthy value (returned) or `timeout` s pass (raises)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def env_path(var):
    """The path `var` names, relative values taken from the repository root (as the tests take
    them, tests/README.md); None when unset or empty. A path that is not there is an error."""
    value = os.environ.get(var)
    if not value:
        return None
    path = value if os.path.isabs(value) else os.path.join(ROOT, value)
    if not os.path.exists(path):
        raise RuntimeError(f"{var}={value} names {path}, which does not exist")
    return path


def assets():
    """Directory with kube-apiserver and etcd (envtest convention), and the operator binary."""
    kb = env_path("KUBEBUILDER_ASSETS")
    if not kb:
        setup = os.path.join(SHARED, "envtest", "setup")
        if not os.path.exists(setup):
            raise RuntimeError("KUBEBUILDER_ASSETS unset and ../shared/envtest/setup missing")
        kb = run([setup]).strip()
    ocp = env_path("OPENSHIFT_OPERATOR")
    if not ocp:
        setup = os.path.join(SHARED, "openshift", "setup")
        if not os.path.exists(setup):
            raise RuntimeError("OPENSHIFT_OPERATOR unset and ../shared/openshift/setup missing")
        ocp = os.path.join(run([setup]).strip(), "cluster-kube-apiserver-operator")
    return kb, ocp


# --- processes ---------------------------------------------------------------------------------


class Proc:
    """A child process in its own process group, its output in a file, with /proc accounting."""

    def __init__(self, name, cmd, logdir, env=None):
        self.name = name
        self.cmd = cmd
        self.logpath = os.path.join(logdir, f"{name}.log")
        self.logf = open(self.logpath, "ab")
        self.logf.write(f"--- start {time.time():.3f}: {' '.join(cmd)}\n".encode())
        self.logf.flush()
        e = dict(os.environ)
        if env:
            e.update(env)
        self.p = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT, env=e,
                                  start_new_session=True)
        self.started = time.monotonic()
        self.peak_rss_kb = 0
        self.final_rss_kb = 0
        self.cpu_ticks = 0

    def alive(self):
        return self.p.poll() is None

    def sample(self):
        """CPU ticks (utime+stime) and RSS now; the peak is VmHWM (the kernel's own high-water
        mark, so short peaks between samples are not missed)."""
        try:
            with open(f"/proc/{self.p.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            self.cpu_ticks = int(fields[11]) + int(fields[12])
            with open(f"/proc/{self.p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        self.peak_rss_kb = max(self.peak_rss_kb, int(line.split()[1]))
                    elif line.startswith("VmRSS:"):
                        self.final_rss_kb = int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
        return self.cpu_ticks

    def cpu_ms(self):
        return self.cpu_ticks * 1000 / CLK_TCK

    def stop(self, timeout=15):
        if self.alive():
            self.sample()
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(10)
        self.logf.close()

    def log_text(self):
        with open(self.logpath, errors="replace") as f:
            return f.read()


# --- openssl -----------------------------------------------------------------------------------


def ossl_time(t):
    return time.strftime("%Y%m%d%H%M%SZ", time.gmtime(t))


class Openssl:
    """Keys and certificates with openssl, including ones dated in the past (`openssl ca`)."""

    def __init__(self, workdir):
        self.d = os.path.join(workdir, "openssl")
        os.makedirs(self.d, exist_ok=True)
        self.n = 0
        with open(os.path.join(self.d, "index.txt"), "w"):
            pass
        with open(os.path.join(self.d, "ca.cnf"), "w") as f:
            f.write(f"""[ca]
default_ca = c
[c]
database = {self.d}/index.txt
new_certs_dir = {self.d}
serial = {self.d}/serial
default_md = sha256
policy = p
unique_subject = no
copy_extensions = none
email_in_dn = no
preserve = yes
[p]
commonName = optional
organizationName = optional
[req]
distinguished_name = dn
[dn]
""")

    def _tmp(self, suffix):
        self.n += 1
        return os.path.join(self.d, f"f{self.n}{suffix}")

    def key(self, kind="rsa"):
        path = self._tmp(".key")
        if kind == "rsa":
            run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                 "-out", path])
        else:
            run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-out", path])
        return path

    def cert(self, key_path, subject, not_before, not_after, ca=None, is_ca=False,
             sans=(), eku=None, template=None):
        """Sign a certificate for `key_path`: self-signed when `ca` is None, else by ca=(crt, key).
        `subject` is an openssl -subj string (/CN=x/O=y); with `template` (a PEM certificate file
        for the same key) its subject is copied byte for byte instead (OpenShift's signer names
        are longer than the 64 characters `openssl req -subj` accepts). Returns the PEM path."""
        ext = self._tmp(".ext")
        with open(ext, "w") as f:
            f.write("[x]\n")
            if is_ca:
                f.write("basicConstraints = critical,CA:TRUE\n"
                        "keyUsage = critical,digitalSignature,keyEncipherment,keyCertSign\n"
                        "subjectKeyIdentifier = hash\n")
            else:
                f.write("basicConstraints = critical,CA:FALSE\n"
                        "keyUsage = critical,digitalSignature,keyEncipherment\n"
                        "authorityKeyIdentifier = keyid\n")
                if eku:
                    f.write(f"extendedKeyUsage = {eku}\n")
                if sans:
                    alt = ",".join(("IP:" if _is_ip(s) else "DNS:") + s for s in sans)
                    f.write(f"subjectAltName = {alt}\n")
        csr = self._tmp(".csr")
        if template:
            run(["openssl", "x509", "-x509toreq", "-in", template, "-signkey", key_path,
                 "-out", csr])
        else:
            run(["openssl", "req", "-new", "-key", key_path, "-subj", subject, "-out", csr,
                 "-config", os.path.join(self.d, "ca.cnf")])
        out = self._tmp(".crt")
        with open(os.path.join(self.d, "serial"), "w") as f:
            f.write(os.urandom(16).hex() + "\n")
        cmd = ["openssl", "ca", "-batch", "-notext", "-config", os.path.join(self.d, "ca.cnf"),
               "-in", csr, "-out", out, "-extfile", ext, "-extensions", "x",
               "-startdate", ossl_time(not_before), "-enddate", ossl_time(not_after)]
        cmd += ["-preserveDN"] if template else ["-subj", subject, "-multivalue-rdn"]
        if ca is None:
            cmd += ["-selfsign", "-keyfile", key_path]
        else:
            cmd += ["-cert", ca[0], "-keyfile", ca[1]]
        run(cmd)
        return out


def _is_ip(s):
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in s else socket.AF_INET, s)
        return True
    except OSError:
        return False


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def cert_info(pem):
    """openssl's view of one PEM certificate: a dict of the facts observed-pki.md lists."""
    p = subprocess.run(["openssl", "x509", "-noout", "-subject", "-issuer", "-dates", "-serial",
                        "-ext", "subjectAltName,extendedKeyUsage,basicConstraints,keyUsage",
                        "-text", "-nameopt", "RFC2253"],
                       input=pem, capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        return {"error": p.stderr.strip()}
    out = p.stdout
    info = {}
    for line in out.splitlines():
        s = line.strip()
        if s.startswith("subject=") and "subject" not in info:
            info["subject"] = s[len("subject="):]
        elif s.startswith("issuer=") and "issuer" not in info:
            info["issuer"] = s[len("issuer="):]
        elif s.startswith("notBefore="):
            info["notBefore"] = s[len("notBefore="):]
        elif s.startswith("notAfter="):
            info["notAfter"] = s[len("notAfter="):]
        elif s.startswith("Signature Algorithm:") and "sigalg" not in info:
            info["sigalg"] = s.split(":", 1)[1].strip()
        elif s.startswith("Public Key Algorithm:"):
            info["keyalg"] = s.split(":", 1)[1].strip()
        elif "Public-Key: (" in s:
            info["keybits"] = s.split("(")[1].split()[0]
        elif s.startswith("DNS:") or s.startswith("IP Address:"):
            info["sans"] = s
        elif s.startswith("CA:"):
            info["ca"] = s
        elif s.startswith("TLS Web"):
            info["eku"] = s
    return info


def split_pem(bundle):
    out, cur = [], []
    for line in bundle.splitlines():
        cur.append(line)
        if line.startswith("-----END"):
            out.append("\n".join(cur) + "\n")
            cur = []
    return out


def openssl_epoch(s):
    """'Nov 23 20:41:50 2026 GMT' → Unix seconds."""
    import calendar
    return calendar.timegm(time.strptime(s.replace("  ", " "), "%b %d %H:%M:%S %Y %Z"))


# --- the API -----------------------------------------------------------------------------------


class Api:
    """Minimal JSON client for the real apiserver (urllib), one bearer token."""

    def __init__(self, url, ca_file, token):
        self.url = url
        self.token = token
        self.ctx = ssl.create_default_context(cafile=ca_file)
        self.ctx.check_hostname = False  # the URL is an IP; the CA is ours alone

    def req(self, method, path, body=None, ok=(200, 201)):
        """One request; a GET that times out or loses its connection is retried (the shared
        machine can stall the apiserver for seconds), three attempts in all."""
        for attempt in range(3):
            try:
                return self._req(method, path, body, ok)
            except (TimeoutError, ConnectionError, urllib.error.URLError) as e:
                if method != "GET" or attempt == 2:
                    raise RuntimeError(f"{method} {path}: {e}") from None
                time.sleep(1)

    def _req(self, method, path, body, ok):
        data = json.dumps(body).encode() if body is not None else None
        r = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
            "Accept": "application/json"})
        try:
            with urllib.request.urlopen(r, context=self.ctx, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            if e.code in ok:
                return e.code, None
            raise RuntimeError(f"{method} {path}: HTTP {e.code}: {e.read()[:500]!r}") from None

    def get(self, path):
        return self.req("GET", path)[1]

    def get_or_none(self, path):
        code, body = self.req("GET", path, ok=(200, 404))
        return body if code == 200 else None

    def put(self, path, body):
        return self.req("PUT", path, body)[1]

    def post(self, path, body):
        return self.req("POST", path, body)[1]

    def delete(self, path):
        self.req("DELETE", path, ok=(200, 202, 404))


def obj_path(kind, ns, name=None):
    res = {"Secret": "secrets", "ConfigMap": "configmaps", "Lease": "leases"}[kind]
    base = (f"/apis/coordination.k8s.io/v1/namespaces/{ns}/{res}" if kind == "Lease"
            else f"/api/v1/namespaces/{ns}/{res}")
    return base + (f"/{name}" if name else "")


def b64(s):
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def unb64(s):
    return base64.b64decode(s).decode()


# --- the cluster -------------------------------------------------------------------------------


AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
"""


class Cluster:
    """etcd + one kube-apiserver (the API every sidecar talks to, with an audit log), and
    extra "consumer" apiservers on the same etcd that serve a synced pair for SNI `localhost`."""

    def __init__(self, workdir, kb, ocp):
        self.w = workdir
        self.kb = kb
        self.ocp = ocp
        self.logdir = os.path.join(workdir, "logs")
        os.makedirs(self.logdir, exist_ok=True)
        self.procs = []
        self.ossl = Openssl(workdir)
        self.tokens = {u: os.urandom(16).hex() for u in USERS}
        self.pki = os.path.join(workdir, "pki")
        os.makedirs(self.pki, exist_ok=True)

    def start(self):
        t = time.time()
        # The apiserver's own serving certificate (default, for 127.0.0.1), client CA, SA keys.
        ca_key = self.ossl.key("ec")
        ca = self.ossl.cert(ca_key, "/CN=compare-openshift-ca", t - 3600, t + 30 * 86400,
                            is_ca=True)
        srv_key = self.ossl.key("ec")
        srv = self.ossl.cert(srv_key, "/CN=127.0.0.1", t - 3600, t + 30 * 86400, ca=(ca, ca_key),
                             sans=["127.0.0.1", "localhost-recovery"], eku="serverAuth")
        shutil.copy(ca, os.path.join(self.pki, "ca.crt"))
        shutil.copy(srv, os.path.join(self.pki, "srv.crt"))
        shutil.copy(srv_key, os.path.join(self.pki, "srv.key"))
        run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
             "-out", os.path.join(self.pki, "sa.key")])
        run(["openssl", "pkey", "-in", os.path.join(self.pki, "sa.key"), "-pubout", "-out",
             os.path.join(self.pki, "sa.pub")])
        with open(os.path.join(self.pki, "tokens.csv"), "w") as f:
            for i, u in enumerate(USERS):
                # system:masters for everyone: RBAC is not what is compared here; the user name
                # is what separates the sidecars' requests in the audit log.
                f.write(f'{self.tokens[u]},{u},uid-{i},"system:masters"\n')
        for u in USERS:
            self.write_kubeconfig(u)
        with open(os.path.join(self.pki, "audit-policy.yaml"), "w") as f:
            f.write(AUDIT_POLICY)
        self.audit_log = os.path.join(self.w, "audit.log")

        ep, pp = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{ep}"
        self.etcd = self.spawn("etcd", [
            os.path.join(self.kb, "etcd"), "--data-dir", os.path.join(self.w, "etcd"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{pp}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{pp}",
            "--initial-cluster", f"default=http://127.0.0.1:{pp}"])
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.apiserver = self.spawn_apiserver("kube-apiserver", self.port, sni=None,
                                              audit=True)
        self.api = Api(self.url, os.path.join(self.pki, "ca.crt"), self.tokens["admin"])
        self.wait_ready(self.url, 60)
        os.environ["KUBECONFIG"] = self.kubeconfig("admin")

    def write_kubeconfig(self, user):
        path = os.path.join(self.pki, f"{user}.kubeconfig")
        with open(path, "w") as f:
            f.write(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:PORT", certificate-authority: {self.pki}/ca.crt}}}}]
users: [{{name: {user}, user: {{token: {self.tokens[user]}}}}}]
contexts: [{{name: c, context: {{cluster: c, user: {user}}}}}]
current-context: c
""")
        return path

    def kubeconfig(self, user):
        path = os.path.join(self.pki, f"{user}.kubeconfig")
        text = read(path).replace("PORT", str(self.port))
        with open(path, "w") as f:
            f.write(text)
        return path

    def spawn(self, name, cmd, env=None):
        p = Proc(name, cmd, self.logdir, env)
        self.procs.append(p)
        return p

    def spawn_apiserver(self, name, port, sni, audit=False):
        cmd = [os.path.join(self.kb, "kube-apiserver"), "--etcd-servers", self.etcd_url,
               "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
               "--secure-port", str(port),
               "--tls-cert-file", os.path.join(self.pki, "srv.crt"),
               "--tls-private-key-file", os.path.join(self.pki, "srv.key"),
               "--client-ca-file", os.path.join(self.pki, "ca.crt"),
               "--token-auth-file", os.path.join(self.pki, "tokens.csv"),
               "--authorization-mode", "RBAC",
               "--service-account-key-file", os.path.join(self.pki, "sa.pub"),
               "--service-account-signing-key-file", os.path.join(self.pki, "sa.key"),
               "--service-account-issuer", "https://kubernetes.default.svc",
               "--service-cluster-ip-range", "10.0.0.0/24",
               "--cert-dir", os.path.join(self.w, name + "-certs")]
        if sni:
            cmd += ["--tls-sni-cert-key", f"{sni[0]},{sni[1]}:localhost"]
        if audit:
            cmd += ["--audit-policy-file", os.path.join(self.pki, "audit-policy.yaml"),
                    "--audit-log-path", self.audit_log, "--audit-log-mode", "blocking",
                    "--audit-log-format", "json"]
        return self.spawn(name, cmd)

    def wait_ready(self, url, timeout):
        ctx = ssl.create_default_context(cafile=os.path.join(self.pki, "ca.crt"))
        ctx.check_hostname = False

        def ready():
            try:
                r = urllib.request.Request(url + "/readyz", headers={
                    "Authorization": f"Bearer {self.tokens['admin']}"})
                with urllib.request.urlopen(r, context=ctx, timeout=5) as resp:
                    return resp.read() == b"ok"
            except Exception:
                return False
        wait_for(f"{url}/readyz", ready, timeout, 0.2)

    def openshift_objects(self):
        """crds.yaml + cluster-objects.sh, as ../shared/openshift/README.md says."""
        d = os.path.join(SHARED, "openshift")
        kc = self.kubeconfig("admin")
        run(["kubectl", "--kubeconfig", kc, "apply", "-f", os.path.join(d, "crds.yaml")])
        # CRDs are served a moment after they are created.
        wait_for("the OpenShift CRDs to be served", lambda: subprocess.run(
            ["kubectl", "--kubeconfig", kc, "get", "kubeapiservers.operator.openshift.io"],
            capture_output=True).returncode == 0, 60, 0.5)
        run([os.path.join(d, "cluster-objects.sh"), kc])

    def audit_counts(self, since_offset=0):
        """Requests per user (unique audit IDs; a watch counts once) from byte offset on;
        returns ({user: {"verb resource": n}}, new offset)."""
        counts = {}
        seen = set()
        try:
            with open(self.audit_log, "rb") as f:
                f.seek(since_offset)
                data = f.read()
        except FileNotFoundError:
            return counts, since_offset
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            aid = ev.get("auditID")
            if aid in seen:
                continue
            seen.add(aid)
            user = ev.get("user", {}).get("username", "?")
            verb = f"{ev.get('verb', '?')} {ev.get('objectRef', {}).get('resource', '?')}"
            counts.setdefault(user, {}).setdefault(verb, 0)
            counts[user][verb] += 1
        return counts, since_offset + end

    def audit_writes(self, since_offset, user):
        """Writes (create/update/patch/delete) by `user` from byte offset on, in order:
        [(verb, "resource ns/name", HTTP code)]."""
        out, seen = [], set()
        try:
            with open(self.audit_log, "rb") as f:
                f.seek(since_offset)
                data = f.read()
        except FileNotFoundError:
            return out
        for line in data.splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("stage") != "ResponseComplete" or ev.get("auditID") in seen:
                continue
            seen.add(ev.get("auditID"))
            if ev.get("user", {}).get("username") != user:
                continue
            if ev.get("verb") not in ("create", "update", "patch", "delete"):
                continue
            ref = ev.get("objectRef", {})
            out.append((ev["verb"], f"{ref.get('resource')} {ref.get('namespace')}/"
                                    f"{ref.get('name', '')}",
                        ev.get("responseStatus", {}).get("code")))
        return out

    def audit_offset(self):
        try:
            return os.path.getsize(self.audit_log)
        except FileNotFoundError:
            return 0

    def stop(self):
        for p in reversed(self.procs):
            p.stop()


def make_workdir(prefix):
    return tempfile.mkdtemp(prefix=prefix)


# --- the OpenShift PKI -------------------------------------------------------------------------

PKI_NAMESPACES = ["openshift-kube-apiserver-operator", "openshift-kube-apiserver",
                  "openshift-config-managed", "openshift-config"]


def managed_objects(api):
    """Every Secret/ConfigMap in the PKI namespaces that carries an OpenShift certificate
    annotation or holds PEM (what the regeneration controller manages)."""
    out = []
    for ns in PKI_NAMESPACES:
        for kind in ("Secret", "ConfigMap"):
            items = api.get(obj_path(kind, ns))["items"]
            for o in items:
                data = o.get("data") or {}
                if kind == "Secret" and o.get("type") == "kubernetes.io/service-account-token":
                    continue
                vals = [unb64(v) if kind == "Secret" else v for v in data.values()]
                if any("BEGIN CERTIFICATE" in v for v in vals):
                    o["kind"] = kind
                    out.append(o)
    return out


def wait_pki(api, expect_targets=("localhost-serving-cert-certkey",), timeout=90):
    """Wait until OpenShift's controller has created its set and it has stopped changing."""
    def present():
        return all(api.get_or_none(obj_path("Secret", "openshift-kube-apiserver", t))
                   for t in expect_targets)
    wait_for("OpenShift's controller to create the PKI", present, timeout, 0.5)
    last, stable_since = None, time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sig = sorted((o["kind"], o["metadata"]["namespace"], o["metadata"]["name"],
                      o["metadata"]["resourceVersion"]) for o in managed_objects(api))
        if sig != last:
            last, stable_since = sig, time.monotonic()
        elif time.monotonic() - stable_since > 5:
            return
        time.sleep(1)
    raise TimeoutError("OpenShift's PKI did not settle")
