"""Where a data set lives: a local directory or a URI that both pyarrow and Spark write."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Location:
    #: pyarrow's file system and the path in it.
    fs: Any  # a pyarrow.fs.FileSystem
    path: str
    #: The same place as Spark names it (an absolute path, or the URI as configured).
    spark_uri: str

    def join(self, *parts: str) -> str:
        return "/".join([self.path.rstrip("/"), *parts])


def spark_path(where: str) -> str:
    """``where`` as Spark names it (no pyarrow needed): a URI as is, a path made absolute."""
    return where if "://" in where else os.path.abspath(where)


def location(where: str) -> Location:
    """A local path (relative to the current directory) or a URI such as ``s3a://b/x``
    (Hadoop's S3A scheme, which pyarrow calls ``s3://``)."""
    import pyarrow.fs as pafs  # not at module level: see core.records.export

    if "://" not in where:
        absolute = spark_path(where)
        return Location(pafs.LocalFileSystem(), absolute, absolute)
    scheme, rest = where.split("://", 1)
    arrow_uri = f"s3://{rest}" if scheme == "s3a" else where
    fs, path = pafs.FileSystem.from_uri(arrow_uri)
    return Location(fs, path, where)
