def main():
    import tapfix.addons, tapfix.schemas, importlib.resources as r
    print("ok", tapfix.addons.default_addons(), list(r.files("tapfix.schemas").iterdir()))
