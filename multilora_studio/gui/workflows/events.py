"""Events and observed fields: how a workflow model tells the widgets bound to it what changed (no Qt)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class Event:
    """Callbacks called with the event's arguments, in the order they were connected."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[..., None]] = []

    def connect(self, callback: Callable[..., None]) -> None:
        self._callbacks.append(callback)

    def disconnect(self, callback: Callable[..., None]) -> None:
        self._callbacks.remove(callback)

    def emit(self, *args: Any) -> None:
        for callback in list(self._callbacks):
            callback(*args)


class Observable:
    """A model whose ``Field`` attributes (and other state it names) announce changes on ``changed(name)``."""

    def __init__(self) -> None:
        self.changed = Event()


class Field(Generic[T]):
    """An attribute of an ``Observable`` with a default: setting a different value emits ``changed(name)``."""

    def __init__(self, default: T) -> None:
        self.default = default
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, model: None, owner: type | None = None) -> Field[T]: ...

    @overload
    def __get__(self, model: Observable, owner: type | None = None) -> T: ...

    def __get__(self, model: Observable | None, owner: type | None = None) -> Field[T] | T:
        if model is None:
            return self
        return model.__dict__.get(self.name, self.default)

    def __set__(self, model: Observable, value: T) -> None:
        if model.__dict__.get(self.name, self.default) == value:
            return
        model.__dict__[self.name] = value
        model.changed.emit(self.name)
