"""The server's control plane: model control (the repository extension, polling), the logging and
trace settings extensions, --cache-config and the `serve --workers` supervisor. Private: the
public face is openinfer.server."""
