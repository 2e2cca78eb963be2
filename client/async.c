/* async.c: placeholder */
