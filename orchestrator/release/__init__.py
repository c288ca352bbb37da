"""Releases on a host: ids, records (with the step journal), the ``current`` switch, history,
pruning.

Layout under a host's install root::

    releases/<id>/        rendered tree, profile.yaml, plan.json, manifest.json, record.json
    releases/.tmp-<id>/   an upload in progress (never pointed to; cleaned by the next apply)
    current -> releases/<id>   switched atomically (symlink + rename)
    secrets/<name>.<id>.env   0600 (dir 0700), the release's secrets, outside its world-readable
                          tree; written at upload, removed when the release is pruned
    secrets/<name>.env        0600, what the units read: a copy of current's, made by the
                          switch only (apply, restore, rollback); none when current has none
"""
