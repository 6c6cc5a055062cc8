# Loopback helpers for shell tests: source this file.
#   free_port             prints a loopback TCP port nobody listens on now
#   metric PORT NAME      the value of the sample NAME (with its labels, as
#                         exposed) at http://127.0.0.1:PORT/metrics
free_port() {
	/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m { print $2 }'; }
