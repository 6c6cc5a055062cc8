#!/usr/bin/env bash
# The real kubectl against the real API server (GKM_KUBE_ASSETS): apply --server-side of the gkm
# CRDs and of the upstream csi-era examples, get (server-side printed Table),
# get -o yaml, describe (Events found by involvedObject.uid), delete, on our
# custom resources and on Nodes, ConfigMaps, Secrets, Leases and Events.
set -u
ROOT=${GKM_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
. "$ROOT/spec/lib/tap.sh"
. "$ROOT/spec/lib/kubeenv.sh"
why=$(kubeenv_unavailable) || { command -v kubectl >/dev/null || why="kubectl is not installed"; }
if [ -n "$why" ]; then
	skip "kubectl against the real API server" "$why"
	finish
	exit 0
fi
kubeenv_start --no-crds --controller-manager || { ok 1 "the API server starts"; finish; exit 1; }
W=$KUBEENV_DIR/work
mkdir -p "$W"
export KUBECACHEDIR=$W/cache
EX=$ROOT/spec/fixtures/upstream-yaml/csi-era

# norm: one space between columns, ages and times replaced by markers.
norm() {
	sed -E 's/[[:space:]]+$//; s/[[:space:]]+/ /g' |
		sed -E 's/(^| )[0-9]+[dhms]([0-9]+[hms])*( \(x[0-9]+ over [0-9a-z]+\))?( |$)/\1<age>\4/g' |
		sed -E 's/[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z/<time>/g'
}
# same NAME CMD...: stdout of CMD (normalised) equals the text on stdin.
same() {
	local name=$1
	shift
	local want got
	want=$(cat)
	got=$("$@" 2>&1 | norm)
	if [ "$got" = "$want" ]; then
		ok 0 "$name"
	else
		ok 1 "$name"
		diff <(echo "$want") <(echo "$got") | sed 's/^/#   /'
	fi
}
# has NAME PATTERN CMD...: some line of the output matches the ERE.
has() {
	local name=$1 pat=$2
	shift 2
	local out
	out=$("$@" 2>&1)
	if echo "$out" | grep -Eq -- "$pat"; then ok 0 "$name"; else
		ok 1 "$name"
		echo "$out" | sed 's/^/#   /' | head -40
	fi
}
now() { date -u +%Y-%m-%dT%H:%M:%SZ; }

# ---------------------------------------------------------------- the CRDs
same "apply --server-side registers the four gkm CRDs" \
	kubectl apply --server-side -f "$ROOT/charts/gkm/crds/" <<'EOF'
customresourcedefinition.apiextensions.k8s.io/clustergkmcachenodes.gkm.io serverside-applied
customresourcedefinition.apiextensions.k8s.io/clustergkmcaches.gkm.io serverside-applied
customresourcedefinition.apiextensions.k8s.io/gkmcachenodes.gkm.io serverside-applied
customresourcedefinition.apiextensions.k8s.io/gkmcaches.gkm.io serverside-applied
EOF
check "the CRDs become Established" sh -c "kubectl wait --for condition=Established --timeout=20s \
	crd/gkmcaches.gkm.io crd/clustergkmcaches.gkm.io crd/gkmcachenodes.gkm.io \
	crd/clustergkmcachenodes.gkm.io >/dev/null"
same "api-resources lists the short names" sh -c "kubectl api-resources --api-group=gkm.io | sort" <<'EOF'
NAME SHORTNAMES APIVERSION NAMESPACED KIND
clustergkmcachenodes cgkmcn gkm.io/v1alpha1 false ClusterGKMCacheNode
clustergkmcaches cgkmc gkm.io/v1alpha1 false ClusterGKMCache
gkmcachenodes gkmcn gkm.io/v1alpha1 true GKMCacheNode
gkmcaches gkmc gkm.io/v1alpha1 true GKMCache
EOF

# ------------------------------------------------- the csi-era examples
cat >"$W/namespaces.yaml" <<'EOF'
apiVersion: v1
kind: Namespace
metadata:
  name: gkm-test-ns-scoped-1
---
apiVersion: v1
kind: Namespace
metadata:
  name: gkm-test-cl-scoped
EOF
same "namespaces for the examples" kubectl apply --server-side -f "$W/namespaces.yaml" <<'EOF'
namespace/gkm-test-ns-scoped-1 serverside-applied
namespace/gkm-test-cl-scoped serverside-applied
EOF
same "apply --server-side of the upstream csi-era examples" kubectl apply --server-side -f "$EX/" <<'EOF'
clustergkmcache.gkm.io/vector-add-cache-rocm-v2 serverside-applied
gkmcache.gkm.io/vector-add-cache-rocm-v2 serverside-applied
pod/gkm-test-pod-1 serverside-applied
pod/gkm-test-pod-1 serverside-applied
csidriver.storage.k8s.io/csi.gkm.io serverside-applied
EOF
NS=gkm-test-ns-scoped-1
C=vector-add-cache-rocm-v2
same "get gkmc before any status" kubectl get gkmc -n $NS <<'EOF'
NAME DIGEST VERIFIED READY-NODES TOTAL-NODES FAILED-NODES INCOMPATIBLE-NODES STATUS AGE
vector-add-cache-rocm-v2 <age>
EOF

# the operator's status, through the status subresource
D=sha256:0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9
T=$(now)
cat >"$W/status.json" <<EOF
{"status": {"resolvedDigest": "$D", "totalNodes": 3, "readyNodes": 2, "failedNodes": 0,
 "incompatibleNodes": 1, "incompatibleNodeConditions": {"BackendMismatch": ["node-3"]},
 "conditions": [
  {"type": "Verified", "status": "True", "reason": "SignatureVerified", "message": "cosign signature verified", "lastTransitionTime": "$T"},
  {"type": "Ready", "status": "True", "reason": "Ready", "message": "ready on 2 of 3 nodes", "lastTransitionTime": "$T"}],
 "counts": {"podRunningCnt": 4},
 "lastUpdated": "$T"}}
EOF
has "patch --subresource=status" "patched" kubectl patch gkmc -n $NS $C --subresource=status --type=merge \
	--patch-file "$W/status.json"
same "get gkmc: digest, verified, ready/total/failed/incompatible nodes, status, age" kubectl get gkmc -n $NS <<EOF
NAME DIGEST VERIFIED READY-NODES TOTAL-NODES FAILED-NODES INCOMPATIBLE-NODES STATUS AGE
vector-add-cache-rocm-v2 $D True 2 3 0 1 Ready <age>
EOF
same "get gkmc -o wide adds image, pods and last update" kubectl get gkmc -n $NS -o wide <<EOF
NAME DIGEST VERIFIED READY-NODES TOTAL-NODES FAILED-NODES INCOMPATIBLE-NODES STATUS AGE IMAGE PODS LAST-UPDATED
vector-add-cache-rocm-v2 $D True 2 3 0 1 Ready <age> quay.io/gkm/cache-examples:vector-add-cache-rocm-v2 4 <age>
EOF
same "get cgkmc (cluster scoped)" kubectl get cgkmc <<'EOF'
NAME DIGEST VERIFIED READY-NODES TOTAL-NODES FAILED-NODES INCOMPATIBLE-NODES STATUS AGE
vector-add-cache-rocm-v2 <age>
EOF
same "get gkmc -A" kubectl get gkmc -A <<EOF
NAMESPACE NAME DIGEST VERIFIED READY-NODES TOTAL-NODES FAILED-NODES INCOMPATIBLE-NODES STATUS AGE
gkm-test-ns-scoped-1 vector-add-cache-rocm-v2 $D True 2 3 0 1 Ready <age>
EOF
same "status writes leave generation alone" kubectl get gkmc -n $NS $C -o 'jsonpath={.metadata.generation}' <<'EOF'
1
EOF

same "get gkmc -o yaml" sh -c "kubectl get gkmc -n $NS $C -o yaml | grep -vE '^  (resourceVersion|uid):'" <<EOF
apiVersion: gkm.io/v1alpha1
kind: GKMCache
metadata:
 creationTimestamp: "<time>"
 generation: 1
 labels:
 gkm.io/signature-format: cosign-v2
 name: vector-add-cache-rocm-v2
 namespace: gkm-test-ns-scoped-1
spec:
 image: quay.io/gkm/cache-examples:vector-add-cache-rocm-v2
status:
 conditions:
 - lastTransitionTime: "<time>"
 message: cosign signature verified
 reason: SignatureVerified
 status: "True"
 type: Verified
 - lastTransitionTime: "<time>"
 message: ready on 2 of 3 nodes
 reason: Ready
 status: "True"
 type: Ready
 counts:
 podRunningCnt: 4
 failedNodes: 0
 incompatibleNodeConditions:
 BackendMismatch:
 - node-3
 incompatibleNodes: 1
 lastUpdated: "<time>"
 readyNodes: 2
 resolvedDigest: $D
 totalNodes: 3
EOF

# Events: describe lists the core Events whose involvedObject.uid is the cache's
CUID=$(kubectl get gkmc -n $NS $C -o 'jsonpath={.metadata.uid}')
T=$(now)
# core_event REASON TYPE MESSAGE [UID]: a core/v1 Event about the cache.
core_event() {
	cat <<EOF
---
apiVersion: v1
kind: Event
metadata:
  generateName: $C.
  namespace: $NS
involvedObject:
  apiVersion: gkm.io/v1alpha1
  kind: GKMCache
  namespace: $NS
  name: $C
${4:+  uid: $4}
reason: $1
message: $3
type: $2
source:
  component: gkm-agent
  host: node-1
firstTimestamp: "$T"
lastTimestamp: "$T"
count: 1
EOF
}
{
	core_event Pulled Normal "cache extracted on node-1" "$CUID"
	cat <<EOF
---
apiVersion: events.k8s.io/v1
kind: Event
metadata:
  generateName: $C-
  namespace: $NS
eventTime: "$(date -u +%Y-%m-%dT%H:%M:%S.000000Z)"
reportingController: gkm.io/operator
reportingInstance: gkm-operator-0
action: Verify
reason: Verified
note: signature verified
type: Normal
regarding:
  apiVersion: gkm.io/v1alpha1
  kind: GKMCache
  namespace: $NS
  name: $C
  uid: $CUID
EOF
	core_event NoUID Warning "this one carries no uid and never shows under describe"
} >"$W/events.yaml"
has "create Events (core/v1 and events.k8s.io/v1)" "event.events.k8s.io/$C-.* created" kubectl create -f "$W/events.yaml"
same "describe gkmc: spec, status, conditions and the Events with its uid" \
	sh -c "kubectl describe gkmc -n $NS $C | grep -vE '^  (Resource Version|UID):'" <<EOF
Name: vector-add-cache-rocm-v2
Namespace: gkm-test-ns-scoped-1
Labels: gkm.io/signature-format=cosign-v2
Annotations: <none>
API Version: gkm.io/v1alpha1
Kind: GKMCache
Metadata:
 Creation Timestamp: <time>
 Generation: 1
Spec:
 Image: quay.io/gkm/cache-examples:vector-add-cache-rocm-v2
Status:
 Conditions:
 Last Transition Time: <time>
 Message: cosign signature verified
 Reason: SignatureVerified
 Status: True
 Type: Verified
 Last Transition Time: <time>
 Message: ready on 2 of 3 nodes
 Reason: Ready
 Status: True
 Type: Ready
 Counts:
 Pod Running Cnt: 4
 Failed Nodes: 0
 Incompatible Node Conditions:
 Backend Mismatch:
 node-3
 Incompatible Nodes: 1
 Last Updated: <time>
 Ready Nodes: 2
 Resolved Digest: $D
 Total Nodes: 3
Events:
 Type Reason Age From Message
 ---- ------ ---- ---- -------
 Normal Verified <age> gkm.io/operator signature verified
 Normal Pulled <age> gkm-agent cache extracted on node-1
EOF
same "get events lists all three (server-side printed)" \
	sh -c "kubectl get events -n $NS --sort-by=.reason -o custom-columns=REASON:.reason,OBJECT:.involvedObject.name,UID:.involvedObject.uid | sed 's/$CUID/<uid>/'" <<EOF
REASON OBJECT UID
NoUID vector-add-cache-rocm-v2 <none>
Pulled vector-add-cache-rocm-v2 <uid>
Verified vector-add-cache-rocm-v2 <uid>
EOF
has "get events: LAST SEEN TYPE REASON OBJECT MESSAGE" \
	"^[0-9]+s +Normal +Pulled +gkmcache/$C +cache extracted on node-1$" kubectl get events -n $NS
has "get events.k8s.io shows the note of the core event" "signature verified" \
	kubectl get events.v1.events.k8s.io -n $NS -o 'jsonpath={.items[*].note}'

# ---------------------------------------------------------- node objects
cat >"$W/node.yaml" <<'EOF'
apiVersion: v1
kind: Node
metadata:
  name: node-1
  labels:
    node-role.kubernetes.io/worker: ""
status:
  conditions:
  - type: Ready
    status: "True"
    reason: KubeletReady
    message: kubelet is posting ready status
    lastHeartbeatTime: "2026-01-01T00:00:00Z"
    lastTransitionTime: "2026-01-01T00:00:00Z"
  nodeInfo:
    kubeletVersion: v1.32.0
EOF
same "apply a Node" kubectl apply --server-side -f "$W/node.yaml" <<'EOF'
node/node-1 serverside-applied
EOF
NODE_UID=$(kubectl get node node-1 -o 'jsonpath={.metadata.uid}')
T=$(now)
cat >"$W/gkmcn.yaml" <<EOF
apiVersion: gkm.io/v1alpha1
kind: GKMCacheNode
metadata:
  name: node-1
  namespace: $NS
  labels:
    gkm.io/node: node-1
  ownerReferences:
  - apiVersion: v1
    kind: Node
    name: node-1
    uid: $NODE_UID
spec:
  nodeName: node-1
EOF
cat >"$W/gkmcn-status.json" <<EOF
{"status": {"gpus": [{"ids": [0, 1], "gpuType": "AMD Instinct MI210", "backend": "hip", "arch": "gfx90a",
  "warpSize": 64, "driverVersion": "6.7.0"}],
 "caches": {"$C": {"digest": "$D", "state": "Ready", "compatibleGPUs": [{"ids": [0, 1]}],
   "pods": [{"podName": "gkm-test-pod-1", "podNamespace": "$NS", "volumeId": "csi-0123"}],
   "lastUpdated": "$T"}},
 "totalCaches": 1, "readyCaches": 1, "failedCaches": 0, "incompatibleCaches": 0, "lastUpdated": "$T"}}
EOF
same "apply a GKMCacheNode owned by its Node" kubectl apply --server-side -f "$W/gkmcn.yaml" <<'EOF'
gkmcachenode.gkm.io/node-1 serverside-applied
EOF
has "its status through the subresource" patched kubectl patch gkmcn -n $NS node-1 --subresource=status \
	--type=merge --patch-file "$W/gkmcn-status.json"
same "get gkmcn: node, GPU, caches ready/total/failed/incompatible" kubectl get gkmcn -n $NS <<'EOF'
NAME NODE GPU CACHES-READY CACHES-TOTAL CACHES-FAILED CACHES-INCOMPATIBLE AGE
node-1 node-1 AMD Instinct MI210 1 1 0 0 <age>
EOF
same "get gkmcn -l gkm.io/node=node-1 (the node label)" \
	kubectl get gkmcn -n $NS -l gkm.io/node=node-1 -o name <<'EOF'
gkmcachenode.gkm.io/node-1
EOF
same "get gkmcn -l gkm.io/node=node-2 finds nothing" kubectl get gkmcn -n $NS -l gkm.io/node=node-2 <<'EOF'
No resources found in gkm-test-ns-scoped-1 namespace.
EOF
same "get nodes" kubectl get nodes <<'EOF'
NAME STATUS ROLES AGE VERSION
node-1 Ready worker <age> v1.32.0
EOF
has "describe node lists its conditions" "^  Ready +True .*KubeletReady +kubelet is posting ready status" \
	kubectl describe node node-1

# ----------------------------------------------- ConfigMaps, Secrets, Leases
cat >"$W/misc.yaml" <<'EOF'
apiVersion: v1
kind: ConfigMap
metadata:
  name: gkm-policies
data:
  compat.lua: "return {}"
  aggregate.lua: "return {}"
---
apiVersion: v1
kind: Secret
metadata:
  name: pull-secret
type: kubernetes.io/dockerconfigjson
stringData:
  .dockerconfigjson: '{"auths":{}}'
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: gkm-operator
spec:
  holderIdentity: gkm-operator-0
  leaseDurationSeconds: 15
EOF
same "apply a ConfigMap, a Secret and a Lease" kubectl apply --server-side -f "$W/misc.yaml" <<'EOF'
configmap/gkm-policies serverside-applied
secret/pull-secret serverside-applied
lease.coordination.k8s.io/gkm-operator serverside-applied
EOF
same "get cm,secret,lease" kubectl get cm,secret,lease <<'EOF'
NAME DATA AGE
configmap/gkm-policies 2 <age>

NAME TYPE DATA AGE
secret/pull-secret kubernetes.io/dockerconfigjson 1 <age>

NAME HOLDER AGE
lease.coordination.k8s.io/gkm-operator gkm-operator-0 <age>
EOF
same "the Secret's stringData was stored as data" kubectl get secret pull-secret -o 'jsonpath={.data.\.dockerconfigjson}' <<'EOF'
eyJhdXRocyI6e319
EOF
same "get configmap -o yaml" sh -c "kubectl get cm gkm-policies -o yaml | grep -vE '^  (resourceVersion|uid):'" <<'EOF'
apiVersion: v1
data:
 aggregate.lua: return {}
 compat.lua: return {}
kind: ConfigMap
metadata:
 creationTimestamp: "<time>"
 name: gkm-policies
 namespace: default
EOF
has "describe configmap shows the data" "^compat.lua:" kubectl describe cm gkm-policies
has "describe secret shows sizes only" "^\.dockerconfigjson:  12 bytes" kubectl describe secret pull-secret
has "describe lease" "^  Holder Identity: +gkm-operator-0" kubectl describe lease gkm-operator

# the other kinds the chart installs are served too (no controller runs them)
cat >"$W/workloads.yaml" <<'EOF'
apiVersion: v1
kind: ServiceAccount
metadata: {name: gkm-agent}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: gkm-agent}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: gkm-agent}
subjects:
- {kind: ServiceAccount, name: gkm-agent, namespace: default}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: gkm-node}
spec:
  selector: {matchLabels: {app: gkm}}
  template:
    metadata: {labels: {app: gkm}}
    spec:
      nodeSelector: {gkm.io/gpu: "true"}
      containers:
      - {name: agent, image: "quay.io/gkm/gkm:v1"}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: gkm-operator}
spec:
  replicas: 2
  selector: {matchLabels: {app: op}}
  template:
    metadata: {labels: {app: op}}
    spec:
      containers:
      - {name: op, image: "quay.io/gkm/gkm:v1"}
---
apiVersion: v1
kind: Service
metadata: {name: gkm-webhook}
spec:
  selector: {app: wh}
  ports:
  - {port: 443, targetPort: 8443}
EOF
same "apply the chart's other kinds" kubectl apply --server-side -f "$W/workloads.yaml" <<'EOF'
serviceaccount/gkm-agent serverside-applied
clusterrolebinding.rbac.authorization.k8s.io/gkm-agent serverside-applied
daemonset.apps/gkm-node serverside-applied
deployment.apps/gkm-operator serverside-applied
service/gkm-webhook serverside-applied
EOF
same "get them" sh -c "kubectl get sa/gkm-agent clusterrolebinding/gkm-agent ds/gkm-node deploy/gkm-operator \
	svc/gkm-webhook | sed -E 's/10\.96\.[0-9]+\.[0-9]+/<ip>/'" <<'EOF'
NAME SECRETS AGE
serviceaccount/gkm-agent 0 <age>

NAME ROLE AGE
clusterrolebinding.rbac.authorization.k8s.io/gkm-agent ClusterRole/gkm-agent <age>

NAME DESIRED CURRENT READY UP-TO-DATE AVAILABLE NODE SELECTOR AGE
daemonset.apps/gkm-node 0 0 0 0 0 gkm.io/gpu=true <age>

NAME READY UP-TO-DATE AVAILABLE AGE
deployment.apps/gkm-operator 0/2 0 0 <age>

NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE
service/gkm-webhook ClusterIP <ip> <none> 443/TCP <age>
EOF

# kubectl create of built-ins sends protobuf bodies
same "kubectl create namespace / configmap / secret (protobuf bodies)" sh -c "kubectl create ns scratch &&
	kubectl create configmap -n scratch cm2 --from-literal=a=1 --from-literal=b=2 &&
	kubectl create secret -n scratch docker-registry regcred --docker-server=registry.local:5000 \
		--docker-username=u --docker-password=p" <<'EOF'
namespace/scratch created
configmap/cm2 created
secret/regcred created
EOF
same "...stored as their JSON form" sh -c "kubectl get -n scratch cm/cm2 secret/regcred \
	-o custom-columns=KIND:.kind,NAME:.metadata.name,NS:.metadata.namespace,DATA:.data.a,TYPE:.type,GEN:.metadata.generateName" <<'EOF'
KIND NAME NS DATA TYPE GEN
ConfigMap cm2 scratch 1 <none> <none>
Secret regcred scratch <none> kubernetes.io/dockerconfigjson <none>
EOF
same "delete the namespace: it goes with its objects" sh -c "kubectl delete ns scratch && kubectl get cm -n scratch" <<'EOF'
namespace "scratch" deleted
No resources found in scratch namespace.
EOF

# ------------------------------------------------------------ deleting
same "delete configmap, secret, lease" kubectl delete cm/gkm-policies secret/pull-secret lease/gkm-operator <<'EOF'
configmap "gkm-policies" deleted
secret "pull-secret" deleted
lease.coordination.k8s.io "gkm-operator" deleted
EOF
same "delete events by name" sh -c "kubectl delete events -n $NS --all | sed -E 's/\"[^\"]+\"/\"<name>\"/' | sort" <<'EOF'
event "<name>" deleted
event "<name>" deleted
event "<name>" deleted
EOF
same "delete gkmc" kubectl delete gkmc -n $NS $C <<'EOF'
gkmcache.gkm.io "vector-add-cache-rocm-v2" deleted
EOF
same "a deleted gkmc is NotFound" kubectl get gkmc -n $NS $C <<'EOF'
Error from server (NotFound): gkmcaches.gkm.io "vector-add-cache-rocm-v2" not found
EOF
same "delete the node" kubectl delete node node-1 <<'EOF'
node "node-1" deleted
EOF
# The garbage collector finds a CRD's kind by re-reading discovery (every 30 s
# in kube-controller-manager), so a loaded machine may need most of a minute.
gone=1
for _ in $(seq 1 900); do
	if kubectl get gkmcn -n $NS 2>&1 | grep -q "No resources found"; then gone=0; break; fi
	sleep 0.1
done
ok $gone "the garbage collector removed the node's GKMCacheNode"
same "delete a CRD removes its objects" kubectl delete crd clustergkmcaches.gkm.io <<'EOF'
customresourcedefinition.apiextensions.k8s.io "clustergkmcaches.gkm.io" deleted
EOF
same "the type is gone from discovery" sh -c "kubectl get --raw /apis/gkm.io/v1alpha1 | grep -o '\"name\":\"[a-z/]*\"' | sort" <<'EOF'
"name":"clustergkmcachenodes"
"name":"clustergkmcachenodes/status"
"name":"gkmcachenodes"
"name":"gkmcachenodes/status"
"name":"gkmcaches"
"name":"gkmcaches/status"
EOF
finish
