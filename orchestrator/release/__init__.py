"""Releases on a host: ids, records (with the step journal), the ``current`` switch, history,
pruning.

Layout under a host's install root::

    releases/<id>/        rendered tree, profile.yaml, plan.json, manifest.json, record.json
    releases/.tmp-<id>/   an upload in progress (never pointed to; cleaned by the next apply)
    current -> releases/<id>   switched atomically (symlink + rename)
    secrets/<name>.env    0600, written by apply, never part of a release
"""
