"""Shared fixtures: tiny random checkpoints that transformers itself saves."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
