"""The words several packages share, kept below all of them: a package that needs a word imports it from
here and nothing else for it (the layer order: these, then the top-level modules' users, config, ...).

- `repair_policy`: `ToolRepairPolicy`, what an unrecoverable tool call becomes (settings, repair stages,
  regeneration and error shapes all speak of it);
- `store_url`: which texts name a capture store (the config file's `db` and `--db` are judged alike).
"""
