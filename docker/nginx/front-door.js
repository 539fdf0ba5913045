// The front door's header check (njs; front-door.conf.template sets $front_door_repeated_header
// from it). nginx 1.22 (Debian 12, `make serve`) reads only the first line of a header sent
// several times, while a server behind it may read the last: a request that names its
// credentials or its encoding twice is refused rather than judged by its first line. nginx
// already refuses a second Authorization over HTTP/1.1; this covers HTTP/2 (gRPC) too.

// header lines a request may carry once at most
var ONCE = ['authorization', 'content-encoding', 'grpc-encoding'];

// the first header of ONCE that the request sends more than once, or ''
function repeated(r) {
    var seen = {};
    var lines = r.rawHeadersIn;
    for (var i = 0; i < lines.length; i++) {
        var name = lines[i][0].toLowerCase();
        if (ONCE.indexOf(name) >= 0) {
            if (seen[name]) {
                return name;
            }
            seen[name] = true;
        }
    }
    return '';
}

export default {repeated};
