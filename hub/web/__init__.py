"""The hub's own pages and what they need: the home page, template values, the
user API the pages call, named servers, the bounded request bodies."""
