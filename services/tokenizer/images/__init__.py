"""Images in requests to a vision-language model: read (sources.py), checked (check.py), counted
per family (families.py) and put into the prompt (front.py)."""
