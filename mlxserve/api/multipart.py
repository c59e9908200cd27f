"""multipart/form-data bodies (file uploads) -> fields, with the standard library's MIME
parser."""

from __future__ import annotations

import email.parser
import email.policy
from dataclasses import dataclass, field

from mlxserve.protocol.errors import bad_request


@dataclass
class Form:
    """A form's text fields (a name may repeat: `timestamp_granularities[]`) and files."""

    fields: dict[str, list[str]] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)  # the last file of each name
    file_counts: dict[str, int] = field(default_factory=dict)  # how many of each name
    filenames: dict[str, str] = field(default_factory=dict)  # as the client named them

    def text(self, name: str) -> str | None:
        values = self.fields.get(name)
        return values[-1] if values else None


def parse_form(content_type: str | None, body: bytes, what: str = "the audio") -> Form:
    """`what`: the file the form carries, for the error when the body is no form."""
    if not content_type or not content_type.lower().startswith("multipart/form-data"):
        raise bad_request(
            f"Send the request as multipart/form-data, with {what} in a field named file."
        )
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart() or message.defects:
        raise bad_request("The multipart/form-data body is malformed.")
    form = Form()
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            continue
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        filename = part.get_filename()
        if filename is not None:
            form.files[name] = data
            form.file_counts[name] = form.file_counts.get(name, 0) + 1
            form.filenames[name] = filename
        else:
            form.fields.setdefault(name, []).append(data.decode("utf-8", "replace"))
    return form
