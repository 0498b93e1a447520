"""Every error class: its tier, str, repr, attributes, and a pickle round trip."""

from __future__ import annotations

import pickle

import pytest

from orbitive import OrbitError
from orbitive._core import _errors
from orbitive._core._errors import ErrorKind, StoreError

ERROR_CLASSES = [
    getattr(_errors, name)
    for name in _errors.__all__
    if isinstance(getattr(_errors, name), type)
    and issubclass(getattr(_errors, name), BaseException)
]
#: The built-in each class mixes in, besides OrbitError (the hierarchy in _errors).
BUILTINS: dict[str, tuple[type[BaseException], ...]] = {
    "InvalidName": (ValueError,),
    "NodeOutsideFleet": (ValueError,),
    "InvalidTtl": (ValueError, TypeError),
    "NamespaceEmpty": (ValueError,),
    "KeyEmpty": (ValueError,),
    "OwnerEmpty": (ValueError,),
    "InvalidEncoding": (ValueError,),
    "EntryTooLarge": (ValueError,),
    "InvalidLayout": (ValueError,),
    "AccessDenied": (PermissionError,),
    "MalformedError": (ValueError,),
    "ReadinessUnavailable": (OSError,),
    "LockTimeout": (TimeoutError,),
    "InvalidLockName": (ValueError, TypeError),
    "InvalidLockOwner": (ValueError, TypeError),
    "InvalidLockTtl": (ValueError, TypeError),
    "InvalidStoreUrl": (ValueError,),
    "LockNotReentrant": (RuntimeError,),
}


def test_every_error_in_the_module_is_covered() -> None:
    assert len(ERROR_CLASSES) == len(_errors.__all__) - 1  # all but ErrorKind
    assert set(BUILTINS) <= {cls.__name__ for cls in ERROR_CLASSES}


def make(cls: type[OrbitError]) -> OrbitError:
    message = f"fleet 'f' node 3: {cls.__name__.lower()} happened (7 of 8)"
    if issubclass(cls, StoreError):
        return cls(message, kind=ErrorKind.UNAVAILABLE, key="jobs/nightly")
    return cls(message, fleet="f", node=3, key=("ns", b"label"), kind=228)


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_error_str_repr_attributes_and_tier(cls: type[OrbitError]) -> None:
    error = make(cls)
    assert isinstance(error, OrbitError)
    for builtin in BUILTINS.get(cls.__name__, ()):
        assert isinstance(error, builtin)
    assert str(error) == error.message
    assert error.message.startswith("fleet 'f' node 3")
    assert repr(error) == f"{cls.__name__}({error.message!r})"
    if issubclass(cls, StoreError):
        assert (error.kind, error.key, error.fleet, error.node) == (
            ErrorKind.UNAVAILABLE,
            "jobs/nightly",
            None,
            None,
        )
    else:
        assert (error.fleet, error.node, error.key, error.kind) == ("f", 3, ("ns", b"label"), 228)


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_error_survives_pickling_with_its_attributes(cls: type[OrbitError]) -> None:
    error = make(cls)
    error.__dict__["extra"] = [1, 2]  # attributes a subclass may add travel too
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert (str(copy), repr(copy)) == (str(error), repr(error))
    assert copy.__dict__ == error.__dict__
    assert copy.args == error.args


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_error_defaults_to_no_attributes(cls: type[OrbitError]) -> None:
    error = cls("plain")
    assert (error.fleet, error.node, error.key) == (None, None, None)
    if issubclass(cls, StoreError):
        assert error.kind is cls.default_kind  # DATABASE, INVALID_INPUT for argument errors
    else:
        assert error.kind is None
    assert pickle.loads(pickle.dumps(error)).message == "plain"


def test_store_argument_errors_default_to_invalid_input() -> None:
    assert StoreError.default_kind is ErrorKind.DATABASE
    assert _errors.InvalidLockTtl.default_kind is ErrorKind.DATABASE  # the duration guard
    for cls in (_errors.InvalidLockName, _errors.InvalidLockOwner, _errors.InvalidStoreUrl):
        assert cls.default_kind is ErrorKind.INVALID_INPUT


def test_store_error_kind_values_are_the_contracts_words() -> None:
    assert [kind.value for kind in ErrorKind] == [
        "database",
        "invalid_input",
        "unavailable",
        "closed",
    ]


def test_error_with_cause_can_be_raised_and_caught_by_builtin() -> None:
    with pytest.raises(ValueError, match="bad ttl"):
        raise _errors.InvalidTtl("bad ttl") from None
    with pytest.raises(PermissionError):
        raise _errors.AccessDenied("nope")
