"""A local Cloud Storage server for tests: gcp-storage-emulator, in memory, with one bucket, whose object
downloads also carry the `x-goog-generation` header that real Cloud Storage sends and TensorStore (Orbax's
array store) needs to update its files.

    python tests/storage_emulator.py PORT BUCKET"""
import sys

from gcp_storage_emulator import server
from gcp_storage_emulator.handlers import objects

plain_download = objects.download


def download(request, response, storage, *args, **kwargs):
    try:
        stored = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        response["x-goog-generation"] = str(stored["generation"])
    except Exception:  # a missing object: the plain handler answers 404
        pass
    plain_download(request, response, storage, *args, **kwargs)


objects.download = download  # objects.get (alt=media) calls it by this name
for _, methods in server.HANDLERS:
    for method, handler in methods.items():
        if handler is plain_download:
            methods[method] = download

if __name__ == "__main__":
    port, bucket = int(sys.argv[1]), sys.argv[2]
    emulator = server.create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
    emulator.run()
