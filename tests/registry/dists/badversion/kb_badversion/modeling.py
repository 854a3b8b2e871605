raise AssertionError("a refused plugin must never be imported")
