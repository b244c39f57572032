"""Errors raised by tvmfuse. Each names what is wrong, where, and how to fix it."""


class TvmfuseError(Exception):
    """Base class of every error tvmfuse raises on purpose."""


class UnknownWorkloadError(TvmfuseError, KeyError):
    def __str__(self):  # KeyError would repr() the message
        return str(self.args[0])


class TargetError(TvmfuseError, ValueError):
    pass


class InputError(TvmfuseError, ValueError):
    pass


class DeviceUnavailableError(TvmfuseError, RuntimeError):
    pass


class FrontendError(TvmfuseError, ValueError):
    """A model could not be imported (missing/corrupt file, unsupported op, bad example inputs)."""


class UnknownKnobError(TvmfuseError, TypeError):
    """A fusion knob (a keyword of build/fuse/explain, or a TVMFUSE_* variable) tvmfuse does not have."""


class ConfigError(TvmfuseError, ValueError):
    """A config value that cannot be used (a TVMFUSE_* variable that is no int or bool)."""


class BackendFallbackError(TvmfuseError, RuntimeError):
    """torch.compile(backend="tvmfuse", options={"fallback": "error"}): a graph tvmfuse cannot
    compile (the message says which and why), or a bad `fallback` option."""


def fall_back_or_raise(log, err: BaseException, what: str, strict: bool) -> None:
    """For an error no contract expects, caught where a fallback exists (a schedule rule that
    raised, a pass that failed): a WARNING that names `what` and the error, then the caller falls
    back; re-raised instead when `strict` (the `strict` knob, which CI and the tests set), so a bug
    fails the build rather than becoming a slower kernel."""
    first = (str(err).strip().splitlines() or [""])[0]
    log.warning("%s raised %s: %s (fell back; TVMFUSE_STRICT=1 makes this an error)",
                what, type(err).__name__, first, exc_info=err)
    if strict:
        raise err
