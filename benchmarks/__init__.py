"""Spotlight's benchmarks, one sub-folder per thing they measure (see README.md).

Why a package: a benchmark imports a helper or another benchmark by its full name,
``from benchmarks.provenance import RESULTS, git_commit, machine``, the same from any folder, test or
working directory. Each program therefore starts by putting the repository root on ``sys.path``.
"""
