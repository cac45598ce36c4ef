"""Packages: ``inferlab`` and its subpackages, plus the top-level ``kernels/`` folder installed as
``inferlab.kernels`` (so no top-level module of ours shadows another project's ``kernels``)."""
from setuptools import find_namespace_packages, find_packages, setup

kernel_pkgs = ["inferlab.kernels"] + [f"inferlab.kernels.{p}" for p in find_packages("kernels")]
setup(packages=find_namespace_packages(include=["inferlab", "inferlab.*"], exclude=["*.__pycache__"]) + kernel_pkgs,
      package_dir={"inferlab.kernels": "kernels"})
