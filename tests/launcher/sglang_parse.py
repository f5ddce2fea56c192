"""Parse server command lines with SGLang's own ServerArgs argparse; print each one's parsed flags as JSON.

Run by the interpreter of SPECSTUDY_SGLANG_PYTHON (the `.sgvenv` SGLang 0.5.23 from `make .sgvenv`):
stdin is a JSON list of argv lists without the `python -m sglang.launch_server` head. A flag SGLang does not know,
or a value of the wrong type, makes argparse exit 2 with SGLang's own message.
"""

from __future__ import annotations

import argparse
import json
import sys

from sglang.srt.server_args import ServerArgs

parsed = []
for argv in json.load(sys.stdin):
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    parsed.append({key: value for key, value in vars(parser.parse_args(argv)).items()
                   if isinstance(value, (str, int, float, bool, type(None)))})
json.dump(parsed, sys.stdout)
