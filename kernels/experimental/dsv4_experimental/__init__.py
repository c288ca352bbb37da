"""Experiments beside the shipped ``dsv4_kernels``: variants no dispatch picks, kept for
side-by-side timing and as starting points. Not shipped to hosts (``install_kernels`` packs
only ``kernels/pyproject.toml`` and ``kernels/dsv4_kernels``), not run by the self-test.

``import dsv4_experimental.decode`` registers the decode experiments (``staged``, ``gp``) with
``dsv4_kernels.sparse_decode.register_variant`` so that ``DecodeConfig(variant="gp")`` runs
them (``dsv4_experimental.pg``: ``pg``, the pipelined gather); ``dsv4_experimental.topk``
holds the earlier top-k methods (``radix1``, ``radix6``) and
radix3 with launches B and C fused. Put ``kernels/experimental`` on ``sys.path`` to import.
"""
