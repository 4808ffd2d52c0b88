"""Python `kubernetes` client against an apiserver (issue #15), run by
tests/tests/mini_apiserver/python.rs in a venv it creates.

argv: URL CA_FILE TOKEN NAMESPACE CHECK_410 (1: the server keeps a short watch history, so a
watch from an old resourceVersion must get 410 Gone and a relist must recover).
Prints one `OK <what>` line per check; any failure raises (non-zero exit).
"""

import sys

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

url, ca, token, ns, check_410 = sys.argv[1:6]
config = client.Configuration()
config.host = url
config.ssl_ca_cert = ca
config.api_key = {"authorization": "Bearer " + token}
api = client.CoreV1Api(client.ApiClient(config))


def cm(name, tier):
    return client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=name, labels={"tier": tier}),
        data={"k": name},
    )


def events(**kwargs):
    """The events a watch delivers until `count` arrived (or its timeout)."""
    count = kwargs.pop("count")
    seen = []
    w = watch.Watch()
    for event in w.stream(api.list_namespaced_config_map, ns, timeout_seconds=20, **kwargs):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == count:
            w.stop()
    return seen


api.create_namespaced_config_map(ns, cm("a", "cp"))
api.create_namespaced_config_map(ns, cm("b", "dp"))
listed = api.list_namespaced_config_map(ns)
assert sorted(i.metadata.name for i in listed.items) == ["a", "b"], listed.items
rv0 = listed.metadata.resource_version
print("OK list", rv0)

# A watch from the list's resourceVersion sees exactly the changes after it.
api.create_namespaced_config_map(ns, cm("c", "dp"))
got = events(resource_version=rv0, count=1)
assert got == [("ADDED", "c")], got
print("OK watch from resourceVersion", got)

# Label-filtered watch: an object that starts matching is ADDED, one that stops is DELETED.
rv1 = api.list_namespaced_config_map(ns).metadata.resource_version
api.patch_namespaced_config_map("b", ns, {"metadata": {"labels": {"tier": "cp"}}})
api.patch_namespaced_config_map("a", ns, {"metadata": {"labels": {"tier": "dp"}}})
api.patch_namespaced_config_map("b", ns, {"data": {"k": "changed"}})
got = events(resource_version=rv1, label_selector="tier=cp", count=3)
assert got == [("ADDED", "b"), ("DELETED", "a"), ("MODIFIED", "b")], got
print("OK label-filtered watch transitions", got)

if check_410 == "1":
    for i in range(10):
        api.patch_namespaced_config_map("c", ns, {"data": {"n": str(i)}})
    try:
        events(resource_version=rv0, count=1)
        raise AssertionError("a watch from an expired resourceVersion did not fail")
    except ApiException as err:
        assert err.status == 410, err
    print("OK 410 Gone from an expired resourceVersion")
    relisted = api.list_namespaced_config_map(ns)
    api.delete_namespaced_config_map("c", ns)
    got = events(resource_version=relisted.metadata.resource_version, count=1)
    assert got == [("DELETED", "c")], got
    print("OK relist and watch again", got)
