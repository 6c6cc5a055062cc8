"""Admission webhooks for the test API server: the
MutatingWebhookConfiguration and ValidatingWebhookConfiguration objects it
stores are honoured as the real server does, by POSTing an AdmissionReview
(admission.k8s.io/v1) to each matching webhook, applying the JSON patches of
mutating ones and refusing what any of them denies.

Services cannot be resolved on a test machine: --service-endpoint
NAMESPACE/NAME=HOST:PORT says where a clientConfig.service listens (TLS is
still verified against caBundle for the name NAME.NAMESPACE.svc)."""
import base64
import http.client
import json
import socket
import ssl
import urllib.parse
import uuid

import ksel


class Denied(Exception):
    """A webhook refused (status) or failed with failurePolicy Fail."""

    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def _selector_matches(sel, labels):
    if not sel:
        return True
    labels = labels or {}
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        key, op, vals = e.get("key"), e.get("operator"), e.get("values") or []
        op = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}.get(op)
        if op is None or not ksel.match_labels([(key, op, vals)], labels):
            return False
    return True


def _rule_matches(rule, rt, sub, op):
    def has(lst, v):
        return "*" in (lst or []) or v in (lst or [])
    if not has(rule.get("operations"), op) or not has(rule.get("apiGroups"), rt.group) \
            or not has(rule.get("apiVersions"), rt.version):
        return False
    res = rt.plural + ("/" + sub if sub else "")
    resources = rule.get("resources") or []
    ok = res in resources or (not sub and "*" in resources) or \
        (sub and ("*/" + sub in resources or "*/*" in resources or rt.plural + "/*" in resources))
    if not ok:
        return False
    scope = rule.get("scope", "*")
    return scope == "*" or scope == ("Namespaced" if rt.namespaced else "Cluster")


class Admission:
    def __init__(self, server, endpoints):
        self.server = server
        self.endpoints = {}          # "ns/name" -> (host, port)
        for e in endpoints or []:
            svc, _, hp = e.partition("=")
            host, _, port = hp.rpartition(":")
            self.endpoints[svc] = (host or "127.0.0.1", int(port))

    def hooks(self, rt, sub, op, obj, old, ns_labels):
        """(kind, webhook) pairs that want this request, mutating first."""
        store = self.server.store
        out = []
        for kind, storage in (("mutating", "admissionregistration.k8s.io/mutatingwebhookconfigurations"),
                              ("validating", "admissionregistration.k8s.io/validatingwebhookconfigurations")):
            objs = store.objs.get(storage) or {}
            for name in sorted(objs):
                for wh in objs[name].get("webhooks") or []:
                    if not any(_rule_matches(r, rt, sub, op) for r in wh.get("rules") or []):
                        continue
                    if rt.namespaced and not _selector_matches(wh.get("namespaceSelector"), ns_labels):
                        continue
                    if rt.plural == "namespaces" and \
                            not _selector_matches(wh.get("namespaceSelector"),
                                                  ((obj or old or {}).get("metadata") or {}).get("labels")):
                        continue
                    osel = wh.get("objectSelector")
                    if osel and not any(_selector_matches(osel, ((o or {}).get("metadata") or {}).get("labels"))
                                        for o in (obj, old) if o is not None):
                        continue
                    out.append((kind, wh))
        return out

    def review(self, hooks, rt, sub, op, obj, old, name, ns, dry, manager, user):
        """Call the webhooks; returns (object after mutation, warnings)."""
        warnings = []
        for kind, wh in hooks:
            req = {"uid": str(uuid.uuid4()),
                   "kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
                   "resource": {"group": rt.group, "version": rt.version, "resource": rt.plural},
                   "requestKind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
                   "requestResource": {"group": rt.group, "version": rt.version, "resource": rt.plural},
                   "name": name, "operation": op, "userInfo": user, "object": obj,
                   "oldObject": old, "dryRun": bool(dry),
                   "options": {"apiVersion": "meta.k8s.io/v1",
                               "kind": {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions",
                                        "DELETE": "DeleteOptions"}.get(op, "CreateOptions")}}
            if manager and op != "DELETE":
                req["options"]["fieldManager"] = manager
            if sub:
                req["subResource"] = sub
                req["requestSubResource"] = sub
            if ns:
                req["namespace"] = ns
            review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}
            try:
                resp = self.call(wh, review)
                r = resp.get("response") if isinstance(resp, dict) else None
                if not isinstance(r, dict) or r.get("uid") != req["uid"]:
                    raise ValueError("expected response.uid=%s, got %r" % (
                        req["uid"], (r or {}).get("uid") if isinstance(r, dict) else None))
            except (OSError, ValueError, ssl.SSLError, http.client.HTTPException) as e:
                if wh.get("failurePolicy", "Fail") == "Ignore":
                    continue
                raise Denied(500, "InternalError", 'Internal error occurred: failed calling webhook '
                             '"%s": failed to call webhook: %s' % (wh.get("name"), e))
            warnings += [w for w in r.get("warnings") or [] if isinstance(w, str)]
            if not r.get("allowed"):
                st = r.get("status") or {}
                code = st.get("code") if isinstance(st.get("code"), int) and st["code"] >= 400 else 400
                msg = st.get("message") or st.get("reason") or ""
                text = 'admission webhook "%s" denied the request' % wh.get("name")
                text = "%s: %s" % (text, msg) if msg else text + " without explanation"
                raise Denied(code, st.get("reason", ""), text, st.get("details"))
            if kind == "mutating" and r.get("patch"):
                if r.get("patchType") != "JSONPatch":
                    raise Denied(500, "InternalError", 'Internal error occurred: webhook "%s" '
                                 'returned an unsupported patchType %r' % (wh.get("name"),
                                                                          r.get("patchType")))
                try:
                    ops = json.loads(base64.b64decode(r["patch"]))
                    obj = self.server.json_patch(obj, ops)
                except Exception as e:  # noqa: BLE001 - any broken patch is the webhook's fault
                    raise Denied(500, "InternalError", 'Internal error occurred: JSON patch of '
                                 'webhook "%s" failed: %s' % (wh.get("name"), e))
        return obj, warnings

    def call(self, wh, review):
        cc = wh.get("clientConfig") or {}
        timeout = float(wh.get("timeoutSeconds") or 10)
        ctx = ssl.create_default_context()
        if cc.get("caBundle"):
            ctx = ssl.create_default_context(cadata=base64.b64decode(cc["caBundle"]).decode())
        if cc.get("url"):
            u = urllib.parse.urlsplit(cc["url"])
            host, port, path = u.hostname, u.port or 443, (u.path or "/") + (
                "?" + u.query if u.query else "")
            sni = host
        elif cc.get("service"):
            s = cc["service"]
            key = "%s/%s" % (s.get("namespace"), s.get("name"))
            if key not in self.endpoints:
                raise OSError("service %s has no endpoint (start the server with "
                              "--service-endpoint %s=HOST:PORT)" % (key, key))
            host, port = self.endpoints[key]
            path = s.get("path") or "/"
            sni = "%s.%s.svc" % (s.get("name"), s.get("namespace"))
        else:
            raise ValueError("webhook %s has no clientConfig.url or service" % wh.get("name"))
        body = json.dumps(review).encode()
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            tls = ctx.wrap_socket(sock, server_hostname=sni)
            conn = http.client.HTTPSConnection(sni, port, timeout=timeout, context=ctx)
            conn.sock = tls
            conn.request("POST", path, body=body, headers={
                "Content-Type": "application/json", "Accept": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                raise ValueError("the server responded with %d: %s" % (resp.status, data[:200]))
            return json.loads(data)
        finally:
            sock.close()
