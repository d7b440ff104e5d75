"""Who may do what (DESIGN.md G13): users, their credentials and their permissions.

:mod:`~flux.auth.credentials` hashes tokens and passwords; :mod:`~flux.auth.permissions`
decides one operation on one topic; :mod:`~flux.auth.users` reads the config's ``auth``
section; :mod:`~flux.auth.sessions` signs and checks the router's session tokens;
:mod:`~flux.auth.identity` turns a HELLO's credentials into an identity. No sockets here
but the router's password check (:mod:`~flux.auth.login`), which runs through the host.
"""
