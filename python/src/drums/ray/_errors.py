"""The cluster's own errors; every drumsd error (`drums.NotFound`,
`drums.Untrusted`, ...) reaches a cluster caller as itself."""

from __future__ import annotations

from drums._errors import DrumsError, Unavailable


class TransferError(DrumsError):
    """A checkpoint's bytes did not arrive whole: the sending node vanished,
    its objects were lost, or what arrived is not what was sent (kind
    `transfer`). The receiving node kept nothing."""


class NodeLost(DrumsError):
    """The node holding a session or checkpoint is gone (its actor, raylet or
    drumsd died; kind `node_lost`). A session on it that was not replicated
    is lost with it: this error, never a silent loss."""


class NoCapacity(Unavailable):
    """No drums node can take what was asked (kind `no_capacity`): the
    message names each node's reason."""
