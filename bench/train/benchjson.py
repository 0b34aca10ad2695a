"""benchjson.py: what report.py and gpt_report.py both read from a run's output."""
import json


def last_json(path, key=None):
    """The last line of file `path` that is a JSON object (and has `key`, if given), or None
    when there is none or the file cannot be read."""
    try:
        with open(path) as f:
            for line in reversed(f.read().splitlines()):
                if line.startswith("{"):
                    d = json.loads(line)
                    if key is None or key in d:
                        return d
    except (OSError, ValueError):
        pass
    return None
