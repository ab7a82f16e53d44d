"""One parser and one resolver: a request from any face becomes a typed Job and Plan, defaults noted."""
