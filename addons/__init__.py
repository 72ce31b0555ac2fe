def default_addons():
    return []
