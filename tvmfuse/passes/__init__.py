"""tvmfuse's own graph passes. `tvmfuse_passes(knobs)` is the list the "tvmfuse" variant runs."""


def tvmfuse_passes(knobs):
    """knobs: a config.Knobs."""
    from tvm import relax

    from ..fusion.fuse_groups_te import FuseGroupsTE
    from .fuse_winograd_epilogue import FuseWinogradEpilogue
    from .scatter_rows import legalize as scatter_rows

    T = relax.transform
    return [T.DeadCodeElimination(), FuseWinogradEpilogue, FuseGroupsTE(knobs=knobs),
            T.LegalizeOps(customize_legalize_map={"relax.scatter_nd": scatter_rows}),
            T.AnnotateTIROpPattern()]
