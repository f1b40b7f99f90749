pytest_plugins = ["refops.testing.pytest_plugin"]
