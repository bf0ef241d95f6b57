
simple*O
INPUT0INT32"
shared_memory_byte_size@"
shared_memory_regionr2&
OUTPUT0
shared_memory_regionr