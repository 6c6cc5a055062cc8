"""Schemas of the built-in kinds the test API server serves: the fields of
each kind with their list and map semantics (x-kubernetes-list-type, map
keys, atomic structs, patch merge keys). They guide managed fields, strategic
merge patches and the OpenAPI documents kubectl reads; fields not listed are
kept as they come."""

S = {"type": "string"}
I32 = {"type": "integer", "format": "int32"}
I64 = {"type": "integer", "format": "int64"}
B = {"type": "boolean"}
T = {"type": "string", "format": "date-time"}
MT = {"type": "string", "format": "date-time"}   # MicroTime
MS = {"type": "object", "additionalProperties": S}
BYTES = {"type": "object", "additionalProperties": {"type": "string", "format": "byte"}}
ANY = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def obj(atomic=False, **props):
    o = {"type": "object", "properties": props}
    if atomic:
        o["x-kubernetes-map-type"] = "atomic"
    return o


def arr(items, key=None, set_=False):
    a = {"type": "array", "items": items}
    if key:
        a.update({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key],
                  "x-kubernetes-patch-merge-key": key, "x-kubernetes-patch-strategy": "merge"})
    elif set_:
        a.update({"x-kubernetes-list-type": "set", "x-kubernetes-patch-strategy": "merge"})
    return a


OBJREF = obj(atomic=True, kind=S, namespace=S, name=S, uid=S, apiVersion=S, resourceVersion=S,
             fieldPath=S)
CONDITION = obj(type=S, status=S, lastHeartbeatTime=T, lastProbeTime=T, lastTransitionTime=T,
                reason=S, message=S, observedGeneration=I64)
CONDITIONS = arr(CONDITION, key="type")
OPEN_NAMED = arr(dict(ANY, properties={"name": S}), key="name")

POD_TEMPLATE = obj(metadata=ANY, spec=dict(ANY, properties={
    "containers": OPEN_NAMED, "initContainers": OPEN_NAMED, "volumes": OPEN_NAMED,
    "nodeSelector": MS, "serviceAccountName": S,
    "tolerations": arr(obj(key=S, operator=S, value=S, effect=S, tolerationSeconds=I64))}))
WORKLOAD_STATUS = dict(ANY, properties={"conditions": CONDITIONS, "observedGeneration": I64})
RULES = arr(obj(apiGroups=arr(S), resources=arr(S), resourceNames=arr(S), verbs=arr(S),
                nonResourceURLs=arr(S)))
SUBJECTS = arr(obj(kind=S, apiGroup=S, name=S, namespace=S))
ROLE_REF = obj(atomic=True, apiGroup=S, kind=S, name=S)
WEBHOOKS = arr(dict(ANY, properties={"name": S}), key="name")

KINDS = {
    "Deployment": {"spec": dict(ANY, properties={"replicas": I32, "selector": ANY,
                                                 "template": POD_TEMPLATE}),
                   "status": WORKLOAD_STATUS},
    "DaemonSet": {"spec": dict(ANY, properties={"selector": ANY, "template": POD_TEMPLATE}),
                  "status": WORKLOAD_STATUS},
    "Service": {"spec": dict(ANY, properties={
        "ports": arr(dict(ANY, properties={"port": I32, "protocol": S, "name": S}), key="port"),
        "selector": MS, "type": S, "clusterIP": S, "clusterIPs": arr(S)}),
        "status": ANY},
    "ServiceAccount": {"secrets": arr(ANY), "imagePullSecrets": arr(obj(name=S)),
                       "automountServiceAccountToken": B},
    "ClusterRole": {"rules": RULES, "aggregationRule": ANY},
    "Role": {"rules": RULES},
    "ClusterRoleBinding": {"subjects": SUBJECTS, "roleRef": ROLE_REF},
    "RoleBinding": {"subjects": SUBJECTS, "roleRef": ROLE_REF},
    "PodDisruptionBudget": {"spec": dict(ANY, properties={"selector": ANY}),
                            "status": WORKLOAD_STATUS},
    "MutatingWebhookConfiguration": {"webhooks": WEBHOOKS},
    "ValidatingWebhookConfiguration": {"webhooks": WEBHOOKS},
    "Namespace": {"spec": obj(finalizers=arr(S)),
                  "status": obj(phase=S, conditions=CONDITIONS)},
    "Node": {
        "spec": obj(podCIDR=S, podCIDRs=arr(S, set_=True), providerID=S, unschedulable=B,
                    taints=arr(obj(key=S, value=S, effect=S, timeAdded=T)), configSource=ANY,
                    externalID=S),
        "status": obj(capacity=MS, allocatable=MS, phase=S, conditions=CONDITIONS,
                      addresses=arr(obj(type=S, address=S), key="type"),
                      daemonEndpoints=obj(kubeletEndpoint=obj(Port=I32)),
                      nodeInfo=obj(machineID=S, systemUUID=S, bootID=S, kernelVersion=S, osImage=S,
                                   containerRuntimeVersion=S, kubeletVersion=S,
                                   kubeProxyVersion=S, operatingSystem=S, architecture=S),
                      images=arr(obj(names=arr(S), sizeBytes=I64)),
                      volumesInUse=arr(S), volumesAttached=arr(obj(name=S, devicePath=S)),
                      config=ANY)},
    "Pod": {
        "spec": dict(ANY, properties={
            "containers": OPEN_NAMED, "initContainers": OPEN_NAMED, "ephemeralContainers": OPEN_NAMED,
            "volumes": OPEN_NAMED, "nodeName": S, "nodeSelector": MS, "serviceAccountName": S,
            "restartPolicy": S, "schedulerName": S, "hostNetwork": B, "priority": I32,
            "tolerations": arr(obj(key=S, operator=S, value=S, effect=S, tolerationSeconds=I64))}),
        "status": dict(ANY, properties={"phase": S, "conditions": CONDITIONS, "podIP": S,
                                        "hostIP": S, "startTime": T, "reason": S, "message": S,
                                        "nominatedNodeName": S, "qosClass": S,
                                        "containerStatuses": arr(ANY)})},
    "ConfigMap": {"data": MS, "binaryData": BYTES, "immutable": B},
    "Secret": {"data": BYTES, "stringData": MS, "type": S, "immutable": B},
    "Event": {"involvedObject": OBJREF, "reason": S, "message": S,
              "source": obj(component=S, host=S), "firstTimestamp": T, "lastTimestamp": T,
              "count": I32, "type": S, "eventTime": MT,
              "series": obj(count=I32, lastObservedTime=MT), "action": S, "related": OBJREF,
              "reportingComponent": S, "reportingInstance": S},
    "events.k8s.io/Event": {
        "eventTime": MT, "series": obj(count=I32, lastObservedTime=MT), "reportingController": S,
        "reportingInstance": S, "action": S, "reason": S, "regarding": OBJREF, "related": OBJREF,
        "note": S, "type": S, "deprecatedSource": obj(component=S, host=S),
        "deprecatedFirstTimestamp": T, "deprecatedLastTimestamp": T, "deprecatedCount": I32},
    "Lease": {"spec": obj(holderIdentity=S, leaseDurationSeconds=I32, acquireTime=MT,
                          renewTime=MT, leaseTransitions=I32, strategy=S, preferredHolder=S)},
    "CSIDriver": {"spec": obj(attachRequired=B, podInfoOnMount=B,
                              volumeLifecycleModes=arr(S, set_=True), storageCapacity=B,
                              fsGroupPolicy=S, tokenRequests=arr(obj(audience=S, expirationSeconds=I64)),
                              requiresRepublish=B, seLinuxMount=B)},
    "CustomResourceDefinition": {
        "spec": obj(group=S, scope=S, preserveUnknownFields=B,
                    names=obj(plural=S, singular=S, kind=S, listKind=S, shortNames=arr(S),
                              categories=arr(S)),
                    versions=arr(ANY), conversion=dict(ANY, properties={"strategy": S})),
        "status": obj(conditions=CONDITIONS, acceptedNames=ANY, storedVersions=arr(S))},
}
