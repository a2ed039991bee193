"""weirflow's version, in one place: the package's ``__version__``, ``weirflow --version``, the wheel's metadata
(pyproject.toml reads it from here) and the digest of a run's code (`weirflow.job.runs`).

Semantic versioning (docs/install.md): until 1.0 a minor version may move or rename public names, each listed
in CHANGELOG.md with where it went; a patch version never does."""

__version__ = "0.2.0"
