"""A list request's query string: its page size, cursor and filters, each checked (a 400
naming the parameter)."""

from __future__ import annotations

from urllib.parse import parse_qs

from mlxserve.protocol.errors import bad_request


class Query:
    def __init__(self, query: str):
        self._lists = parse_qs(query)
        self._values = {k: v[-1] for k, v in self._lists.items()}

    def text(self, name: str) -> str | None:
        return self._values.get(name) or None

    def all(self, name: str) -> list[str]:
        """Every value of a repeated parameter (`name=a&name=b`, or `name[]=a`)."""
        return self._lists.get(name, []) + self._lists.get(f"{name}[]", [])

    def limit(self, default: int, most: int) -> int:
        given = self._values.get("limit")
        if given is None:
            return default
        if not given.isdigit() or not 1 <= int(given) <= most:
            raise bad_request(f"limit must be an integer from 1 to {most}.", param="limit")
        return int(given)

    def choice(self, name: str, choices: tuple[str, ...]) -> str:
        """The parameter, one of `choices` (the first if not given)."""
        given = self._values.get(name, choices[0])
        if given not in choices:
            raise bad_request(f"{name} must be one of {', '.join(choices)}.", param=name)
        return given
