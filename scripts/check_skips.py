"""Fail CI when a test it is meant to run was skipped.

Reads pytest's JUnit XML. Skips whose reason starts with "optional:" (e.g. in-process vLLM,
which cannot be installed here) are allowed; any other skip means a capability went
unexercised, so the run fails.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

path = sys.argv[1] if len(sys.argv) > 1 else "out/junit.xml"
bad = []
for case in ET.parse(path).getroot().iter("testcase"):
    for skipped in case.findall("skipped"):
        reason = skipped.get("message", "")
        if not reason.startswith("optional:"):
            bad.append(f"{case.get('classname')}::{case.get('name')}: {reason}")
if bad:
    print(f"check_skips: {len(bad)} test(s) CI must run were skipped:")
    print("\n".join(f"  {b}" for b in bad))
    sys.exit(1)
print("check_skips: no unexpected skips")
